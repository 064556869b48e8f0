"""Elementwise and normalisation primitives of the reference forward pass.

Inputs may be float32 or float64; every function computes in float64 and returns float64 so that callers
decide where a value is rounded back to float32 (the precision at which engines keep activations).
"""

from __future__ import annotations

import numpy as np

F64 = np.float64


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, stable for large |x|."""
    x = np.asarray(x, dtype=F64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=F64)
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), linear above 20 as torch and ggml do."""
    x = np.asarray(x, dtype=F64)
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (weight is the stored GGUF gamma)."""
    x = np.asarray(x, dtype=F64)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * np.asarray(weight, dtype=F64)


def grouped_rms_norm(x: np.ndarray, weight: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """RMS-normalise each of `groups` equal slices of the last axis on its own, then scale by the flat weight."""
    x = np.asarray(x, dtype=F64)
    shaped = x.reshape(*x.shape[:-1], groups, x.shape[-1] // groups)
    inv = 1.0 / np.sqrt(np.mean(shaped * shaped, axis=-1, keepdims=True) + eps)
    return (shaped * inv).reshape(x.shape) * np.asarray(weight, dtype=F64).reshape(-1)


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps): the form transformers' GDN uses (eps inside the root)."""
    x = np.asarray(x, dtype=F64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def rope_tables(positions: np.ndarray, rope_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [len(positions), rope_dim // 2], built in float64."""
    half = rope_dim // 2
    inv_freq = 1.0 / (float(theta) ** (np.arange(half, dtype=F64) * 2.0 / rope_dim))
    angles = np.asarray(positions, dtype=F64)[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NEOX (rotate-half) RoPE on the first 2*cos.shape[-1] dims of the last axis; the rest pass through.

    x is [T, ..., d]; cos/sin are [T, half] and broadcast over the middle axes.
    """
    x = np.asarray(x, dtype=F64).copy()
    half = cos.shape[-1]
    extra = (slice(None),) + (None,) * (x.ndim - 2) + (slice(None),)
    c, s = cos[extra], sin[extra]
    a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
    x[..., :half] = a * c - b * s
    x[..., half:2 * half] = b * c + a * s
    return x
