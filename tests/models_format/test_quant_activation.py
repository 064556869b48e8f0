"""q8_32 activation quantization and the integer matvec of docs/forms.md."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from strata.errors import InvalidArgument
from strata.quant import QuantTensor, dequantize, matvec, quantize_activation, repack
from strata.quant.dequant import group_offsets
from strata.quant.forms import FORMS
from strata.quant.synthetic import random_blocks


def test_quantize_activation_reconstructs_within_half_a_step(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 256)).astype(np.float32) * np.float32(rng.uniform(1e-3, 1e3))
    xq, dx, sums = quantize_activation(x)
    assert xq.dtype == np.int8 and dx.dtype == np.float32 and sums.dtype == np.int32
    assert dx.shape == sums.shape == (3, 8)
    blocks = x.reshape(3, 8, 32)
    assert np.array_equal(dx, np.abs(blocks).max(-1) / np.float32(127))
    assert np.array_equal(sums, xq.reshape(3, 8, 32).sum(-1))
    assert np.abs(xq.reshape(3, 8, 32)).max(-1).min() == 127  # the block maximum maps to +-127
    # rounding to the nearest step: |x - xq dx| <= dx / 2, with float32 slack on x / dx
    err = np.abs(blocks - xq.reshape(3, 8, 32) * dx[..., None])
    assert (err <= dx[..., None] * 0.5001).all(), f"max error {err.max()}"


def test_quantize_activation_edge_cases(rng: np.random.Generator) -> None:
    dx = np.float32(2.0 ** int(rng.integers(-10, 10)))  # a power of two: x / dx is exact, ties stay ties
    x = np.zeros((4, 32), np.float32)
    # block 0 stays all zero; block 1: max at +127, ties at +-0.5, +-1.5, +-2.5 steps; block 2: max at -127
    ties = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5], np.float32)
    x[1, :8] = ties * dx
    x[1, 8] = 127 * dx
    x[2, 0] = -127 * dx
    x[2, 1:5] = np.array([0.49999997, -0.49999997, 3.4999998, -3.5], np.float32) * dx
    x[3, :] = np.float32(1e-44)  # max / 127 underflows to zero: the block quantizes to zeros
    xq, got_dx, sums = quantize_activation(x.reshape(-1))
    xq = xq.reshape(4, 32)
    assert got_dx[0] == 0 and not xq[0].any() and sums[0] == 0
    assert got_dx[1] == dx and got_dx[2] == dx, (got_dx, dx)
    assert xq[1, :9].tolist() == [1, -1, 2, -2, 3, -3, 127, -127, 127]
    assert xq[2, :5].tolist() == [-127, 0, 0, 3, -4]
    assert got_dx[3] == 0 and not xq[3].any()
    assert sums.tolist() == [0, int(xq[1].sum()), int(xq[2].sum()), 0]


@pytest.mark.parametrize("bad", [np.ones(31, np.float32), np.array([np.nan] + [1.0] * 31, np.float32)])
def test_quantize_activation_rejects(bad: np.ndarray) -> None:
    with pytest.raises(InvalidArgument):
        quantize_activation(bad)


@pytest.mark.parametrize("ggml_type", list(FORMS), ids=lambda t: t.name)
def test_matvec_matches_float64_of_dequantized_operands(ggml_type: T, rng: np.random.Generator) -> None:
    rows, cols, n = int(rng.integers(1, 33)), 256 * int(rng.integers(1, 6)), 3
    w = repack(random_blocks(ggml_type, rows * cols, rng), ggml_type, (cols, rows))
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w64 = dequantize(w).astype(np.float64)
    if isinstance(w, np.ndarray):  # float forms take x as float32
        x64 = x.astype(np.float64)
    else:
        xq, dx, _ = quantize_activation(x)
        x64 = xq.reshape(n, -1, 32).astype(np.float64) * dx[..., None].astype(np.float64)
        x64 = x64.reshape(n, cols)
    want = x64 @ w64.T
    got = matvec(w, x)
    assert got.dtype == np.float32 and got.shape == (n, rows)
    assert np.array_equal(matvec(w, x[1]), got[1]), "a single vector must match its row of the batch"
    # Both sides see the same operands; what differs is float32 rounding: of each dequantized weight
    # (relative to |d s v| + |m|, which may cancel) and along the float32 sums over at most 80 blocks
    # (pairwise: ~log2 of that deep). 2^-24 (6e-8) per rounding, ~16 deep: 1e-6 of the |w||x| product
    # (observed: under 5e-8).
    scale = np.abs(x64) @ np.abs(w64).T + _offset_magnitude(w, x64)
    err = np.abs(got - want)
    assert np.isfinite(got).all()
    assert (err <= 1e-6 * scale + 1e-30).all(), f"{ggml_type.name}: worst {np.max(err / (scale + 1e-30)):.3g} of |w||x|"


def _offset_magnitude(w: QuantTensor | np.ndarray, x64: np.ndarray) -> np.ndarray:
    """Σ |mins * sub_mins| |x| per row: the part of |w| an offset may cancel away."""
    offsets = None if isinstance(w, np.ndarray) else group_offsets(w)
    if offsets is None:
        return np.float64(0)
    per_element = np.repeat(np.abs(offsets.astype(np.float64)), w.form.group_size, axis=1)
    return np.abs(x64) @ per_element.T
