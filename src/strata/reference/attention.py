"""Gated full attention with partial NEOX RoPE (docs/models/qwen3next.md §3.2, qwen4exp.md §3(c))."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.options import KV
from strata.reference import kv_formats
from strata.reference.ops import apply_rope, rms_norm, sigmoid
from strata.reference.weights import Weights


@dataclass(frozen=True)
class AttentionShape:
    n_head: int
    n_head_kv: int
    head_dim: int


class KvState:
    """Per-layer K (normed, roped) and V caches, float32 [n_head_kv, tokens, head_dim]: the rows as computed, or
    with `kv` (a strata.KV) as a session's cache of that format holds them (kv_formats.held)."""

    def __init__(self, shape: AttentionShape, kv: KV | str | None = None):
        self.k = np.zeros((shape.n_head_kv, 0, shape.head_dim), dtype=np.float32)
        self.v = np.zeros((shape.n_head_kv, 0, shape.head_dim), dtype=np.float32)
        self.halves = None if kv is None else kv_formats.halves(kv)

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows k, v [n_head_kv, tokens, head_dim] after the cached ones."""
        if self.halves is not None:
            k, v = kv_formats.held(k, self.halves[0]), kv_formats.held(v, self.halves[1])
        self.k = np.concatenate([self.k, k], axis=1)
        self.v = np.concatenate([self.v, v], axis=1)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v over the allowed keys, GQA with q-head h on kv-head h // group.

    q [T, Hq, d]; k, v [Hkv, P, d]; allowed [T, P] bool. Returns [T, Hq, d] float64. A row with no allowed
    key returns zeros.
    """
    t, hq, d = q.shape
    group = hq // k.shape[0]
    kk = np.repeat(k.astype(np.float64), group, axis=0)           # [Hq, P, d]
    vv = np.repeat(v.astype(np.float64), group, axis=0)
    scores = np.einsum("thd,hpd->thp", q.astype(np.float64), kk) / np.sqrt(d)
    scores = np.where(allowed[:, None, :], scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(scores - top)
    denom = p.sum(axis=-1, keepdims=True)
    p = p / np.where(denom > 0, denom, 1.0)
    return np.einsum("thp,hpd->thd", p, vv)


def gated_attention(weights: Weights, layer: int, x: np.ndarray, state: KvState, shape: AttentionShape,
                    cos: np.ndarray, sin: np.ndarray, eps: float, selected: np.ndarray | None = None) -> np.ndarray:
    """Attention mixer of `layer` on x [T, n] at the positions of cos/sin [T, rope/2]; appends to `state`.

    `selected` [T, P] (P = tokens cached after this call) restricts each row further than causality (QSA).
    Returns out [T, n] float32.
    """
    b = f"blk.{layer}."
    t = x.shape[0]
    h, hkv, d = shape.n_head, shape.n_head_kv, shape.head_dim
    qg = weights.matmul(b + "attn_q.weight", x).reshape(t, h, 2 * d)   # per head [q | gate]
    q, gate = qg[:, :, :d], qg[:, :, d:]
    k = weights.matmul(b + "attn_k.weight", x).reshape(t, hkv, d)
    v = weights.matmul(b + "attn_v.weight", x).reshape(t, hkv, d)
    q = apply_rope(rms_norm(q, weights.get(b + "attn_q_norm.weight"), eps), cos, sin).astype(np.float32)
    k = apply_rope(rms_norm(k, weights.get(b + "attn_k_norm.weight"), eps), cos, sin).astype(np.float32)

    past = state.k.shape[1]
    state.append(k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    total = past + t
    allowed = np.arange(total)[None, :] <= (past + np.arange(t))[:, None]
    if selected is not None:
        allowed &= selected
    a = attend(q, state.k, state.v, allowed)
    o = (a * sigmoid(gate)).astype(np.float32).reshape(t, h * d)
    return weights.matmul(b + "attn_output.weight", o)
