"""The value transforms llama.cpp's converter applies between HF tensors and GGUF tensors.

All inputs and outputs are float32 numpy arrays in HF (row-major, [out, in]) orientation; a GGUF
weight with ne = {in, out} is exactly such an array. See docs/models/qwen3next.md §2.4 and
qwen4exp.md §2.3.
"""

from __future__ import annotations

import numpy as np

from strata.errors import FormatError


def gamma_plus_one(w: np.ndarray) -> np.ndarray:
    """HF RMSNorm computes x * (1 + w); GGUF stores the effective gamma 1 + w (added in float32)."""
    return w.astype(np.float32) + np.float32(1.0)


def decay_from_a_log(a_log: np.ndarray) -> np.ndarray:
    """GGUF ssm_a = -exp(A_log)."""
    return -np.exp(a_log.astype(np.float32))


def squeeze_conv(w: np.ndarray) -> np.ndarray:
    """A depthwise Conv1d weight [C, 1, K] -> [C, K] (GGUF ne {K, C})."""
    if w.ndim != 3 or w.shape[1] != 1:
        raise FormatError(f"conv1d weight has shape {list(w.shape)}, expected [channels, 1, kernel]")
    return w[:, 0, :]


def grouped_to_tiled(x: np.ndarray, n_k_heads: int, n_v_heads: int, axis: int = 0) -> np.ndarray:
    """Reorder V heads from HF "grouped" order to the qwen35 GGUF "tiled" order along `axis`.

    HF head g*r + i (g = key head, i < r = Hv/Hk) becomes GGUF head i*Hk + g, so that GGUF v-head j
    reads key head j % Hk. Each head is a contiguous run of x.shape[axis] / Hv entries.
    """
    r = n_v_heads // n_k_heads
    moved = np.moveaxis(x, axis, 0)
    per_head = moved.shape[0] // n_v_heads
    if per_head * n_v_heads != moved.shape[0]:
        raise FormatError(f"V-head reorder: axis of {moved.shape[0]} is not a multiple of {n_v_heads} heads")
    grouped = moved.reshape(n_k_heads, r, per_head, *moved.shape[1:])
    tiled = grouped.swapaxes(0, 1).reshape(moved.shape)
    return np.moveaxis(tiled, 0, axis)


def reorder_v_rows(x: np.ndarray, v_start: int, n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """Tiled V order for rows [v_start:] (the value part of a [q | k | v] projection or conv), rest unchanged."""
    return np.concatenate([x[:v_start], grouped_to_tiled(x[v_start:], n_k_heads, n_v_heads)], axis=0)


def split_qkvz(w: np.ndarray, n_k_heads: int, head_k: int, n_v_heads: int, head_v: int) -> tuple[np.ndarray, np.ndarray]:
    """qwen3next in_proj_qkvz (rows grouped per key head g: [q_g, k_g, v_g*, z_g*]) -> (attn_qkv, attn_gate).

    attn_qkv = [all q | all k | all v], attn_gate = all z; V/Z heads stay in HF order (no reorder for qwen3next).
    """
    r = n_v_heads // n_k_heads
    per_group = 2 * head_k + 2 * r * head_v
    if w.shape[0] != n_k_heads * per_group:
        raise FormatError(f"in_proj_qkvz has {w.shape[0]} rows, expected {n_k_heads} x {per_group}")
    g = w.reshape(n_k_heads, per_group, w.shape[1])
    cuts = np.cumsum([head_k, head_k, r * head_v])
    q, k, v, z = np.split(g, cuts, axis=1)
    flat = [part.reshape(-1, w.shape[1]) for part in (q, k, v, z)]
    return np.concatenate(flat[:3], axis=0), flat[3]
