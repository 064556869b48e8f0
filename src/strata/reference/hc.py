"""Hyper-connection mixers of qwen4exp (docs/models/qwen4exp.md §3(a)).

The residual is `hc` parallel streams H [T, hc, n]. A mixer reads them into one block input x and, for the
two per-layer mixers, also gives the per-stream injection weights used to write the block output back.
"""

from __future__ import annotations

import numpy as np

from strata.reference.ops import grouped_rms_norm, sigmoid, silu
from strata.reference.weights import Weights


def hc_read(weights: Weights, prefix: str, streams: np.ndarray, eps: float,
            inject: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Mix streams [T, hc, n] through `{prefix}_{norm,down,up,inject}.weight`.

    Returns x [T, n] float32 and, when `inject`, inj [T, hc] float32 (2*sigmoid(W_inj Hn / hc)).
    """
    t, hc, n = streams.shape
    normed = grouped_rms_norm(streams.reshape(t, hc * n), weights.get(f"{prefix}_norm.weight"), hc, eps)
    normed32 = normed.astype(np.float32)
    low = silu(weights.matmul(f"{prefix}_down.weight", normed32) / hc).astype(np.float32)
    mix = sigmoid(weights.matmul(f"{prefix}_up.weight", low)).reshape(t, hc, n)
    x = np.mean(mix * normed.reshape(t, hc, n), axis=1).astype(np.float32)
    if not inject:
        return x, None
    inj = (2.0 * sigmoid(weights.matmul(f"{prefix}_inject.weight", normed32) / hc)).astype(np.float32)
    return x, inj


def hc_write(streams: np.ndarray, inj: np.ndarray, y: np.ndarray) -> np.ndarray:
    """H[k] += inj[k] * y: the block output added to every raw (un-normalised) stream."""
    return (streams.astype(np.float64) + inj[:, :, None].astype(np.float64) * y[:, None, :]).astype(np.float32)
