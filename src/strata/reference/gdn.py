"""Gated DeltaNet (linear attention) layer: docs/models/qwen3next.md §3.1, qwen4exp.md §3(b).

Three GGUF layouts share the recurrence and differ in projections, v-head -> k-head map and output gate:
qwen3next (`ssm_ba` interleaved per k-head, grouped heads, SiLU gate), qwen35moe (`ssm_beta`/`ssm_alpha`,
tiled heads, SiLU gate) and qwen4exp (qwen35moe layout, sigmoid gate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.reference.ops import l2_normalize, rms_norm, sigmoid, silu, softplus
from strata.reference.weights import Weights


@dataclass(frozen=True)
class GdnShape:
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    tiled_heads: bool        # GGUF v-head h reads k-head h % Hk (qwen35 family) instead of h // (Hv/Hk)
    interleaved_ba: bool     # qwen3next: one `ssm_ba` tensor, per k-head [b x r | a x r]
    sigmoid_gate: bool       # qwen4exp output gate sigmoid(z) instead of silu(z)

    @property
    def conv_channels(self) -> int:
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim

    def k_head_of_v_head(self) -> np.ndarray:
        h = np.arange(self.n_v_heads)
        ratio = self.n_v_heads // self.n_k_heads
        return h % self.n_k_heads if self.tiled_heads else h // ratio


class GdnState:
    """Per-layer state: the last K-1 raw (pre-conv) qkv rows and the fp32 recurrent state S[Hv, dk, dv]."""

    def __init__(self, shape: GdnShape):
        self.conv = np.zeros((shape.conv_kernel - 1, shape.conv_channels), dtype=np.float32)
        self.recurrent = np.zeros((shape.n_v_heads, shape.head_k_dim, shape.head_v_dim), dtype=np.float32)


def causal_conv_silu(history: np.ndarray, rows: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """silu of the depthwise causal conv over [history | rows]; kernel [C, K], column K-1 hits the newest row."""
    window = np.concatenate([history, rows]).astype(np.float64)
    k = kernel.shape[1]
    out = np.zeros(rows.shape, dtype=np.float64)
    for j in range(k):
        out += window[j:j + rows.shape[0]] * kernel[:, j].astype(np.float64)
    return silu(out)


def delta_rule_step(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray,
                    beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token of the gated delta rule for all v-heads (q, k already normalised, q scaled, both per v-head).

    state [H, dk, dv]; q, k [H, dk]; v [H, dv]; decay = g (<= 0) and beta [H].
    Returns (output [H, dv], new state), both float64.
    """
    s = state.astype(np.float64) * np.exp(decay)[:, None, None]
    kv = np.einsum("hij,hi->hj", s, k)
    delta = (v - kv) * beta[:, None]
    s = s + k[:, :, None] * delta[:, None, :]
    return np.einsum("hij,hi->hj", s, q), s


def _beta_alpha(weights: Weights, b: str, x: np.ndarray, shape: GdnShape) -> tuple[np.ndarray, np.ndarray]:
    if not shape.interleaved_ba:
        return weights.matmul(b + "ssm_beta.weight", x), weights.matmul(b + "ssm_alpha.weight", x)
    r = shape.n_v_heads // shape.n_k_heads
    ba = weights.matmul(b + "ssm_ba.weight", x).reshape(x.shape[0], shape.n_k_heads, 2 * r)
    return ba[:, :, :r].reshape(x.shape[0], -1), ba[:, :, r:].reshape(x.shape[0], -1)


def gdn_forward(weights: Weights, layer: int, x: np.ndarray, state: GdnState, shape: GdnShape,
                eps: float) -> np.ndarray:
    """GDN mixer of `layer` on x [T, n]; updates `state`; returns out [T, n] float32."""
    b = f"blk.{layer}."
    t = x.shape[0]
    hk, hv, dk, dv = shape.n_k_heads, shape.n_v_heads, shape.head_k_dim, shape.head_v_dim
    qkv = weights.matmul(b + "attn_qkv.weight", x)
    z = weights.matmul(b + "attn_gate.weight", x).reshape(t, hv, dv)
    beta_in, alpha_in = _beta_alpha(weights, b, x, shape)
    beta = sigmoid(beta_in)
    decay = weights.get(b + "ssm_a").reshape(-1) * softplus(alpha_in + weights.get(b + "ssm_dt.bias").reshape(-1))

    conv = causal_conv_silu(state.conv, qkv, weights.get(b + "ssm_conv1d.weight")).astype(np.float32)
    state.conv = np.concatenate([state.conv, qkv])[-(shape.conv_kernel - 1):]
    q = l2_normalize(conv[:, :hk * dk].reshape(t, hk, dk)) / np.sqrt(dk)
    k = l2_normalize(conv[:, hk * dk:2 * hk * dk].reshape(t, hk, dk))
    v = conv[:, 2 * hk * dk:].reshape(t, hv, dv).astype(np.float64)
    kmap = shape.k_head_of_v_head()

    core = np.zeros((t, hv, dv), dtype=np.float64)
    for i in range(t):
        core[i], s = delta_rule_step(state.recurrent, q[i, kmap], k[i, kmap], v[i], decay[i], beta[i])
        state.recurrent = s.astype(np.float32)  # engines keep S in fp32 between tokens
    gate = sigmoid(z) if shape.sigmoid_gate else silu(z)
    y = (rms_norm(core.astype(np.float32), weights.get(b + "ssm_norm.weight"), eps) * gate).astype(np.float32)
    return weights.matmul(b + "ssm_out.weight", y.reshape(t, hv * dv))
