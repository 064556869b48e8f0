"""What each synthetic tensor should look like so that activations stay finite through every layer.

Matrices: root-mean-square 1/sqrt(fan_in) (fan_in = ne0), so a matvec keeps the activation scale.
Embedding tables: RMS 1 (rows are looked up, not multiplied). The small parameter vectors that carry
meaning get realistic values: norm gammas near 1, ssm_a negative (a decay), dt bias near 1, conv taps
of RMS 1/sqrt(kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Special = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]

_TABLES = ("token_embd.weight", "per_layer_token_embd.weight")


def _near_one(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)


def _decay(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # HF initialises A_log = log(U(1, 16)); ssm_a = -exp(A_log)
    return (-rng.uniform(1.0, 16.0, shape)).astype(np.float32)


def _dt_bias(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)


def _conv(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def special(name: str) -> Special | None:
    """A value generator for tensors whose values matter beyond their scale, else None."""
    if name.endswith("norm.weight") or name.endswith(("_norm_key.weight", "_norm_query.weight", "_norm_conv.weight")):
        return _near_one
    if name.endswith(".ssm_a"):
        return _decay
    if name.endswith(".ssm_dt.bias"):
        return _dt_bias
    if name.endswith("conv1d.weight"):
        return _conv
    return None


def rms(name: str, ne: tuple[int, ...]) -> float:
    """Intended root-mean-square of a random tensor."""
    if name in _TABLES:
        return 1.0
    return float(1.0 / np.sqrt(ne[0]))
