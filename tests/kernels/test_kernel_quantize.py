"""q8_32 activation quantization on the GPU vs strata.quant.quantize_activation (docs/forms.md)."""

import numpy as np
import pytest

import strata
from support.hooks import native_check as _native_check
from strata.quant import quantize_activation

pytestmark = pytest.mark.hooks


def _check_exact(x: np.ndarray, seed_note: str) -> None:
    xq, dx, sums = _native_check.quantize_q8_32(x)
    want_xq, want_dx, want_sums = quantize_activation(x)
    # Same IEEE division and rounding rule: every output is bit-exact, not just close.
    assert np.array_equal(dx.view(np.uint32), want_dx.view(np.uint32)), f"dx differs ({seed_note})"
    assert np.array_equal(xq, want_xq), f"xq differs at {np.flatnonzero(xq != want_xq)[:8]} ({seed_note})"
    assert np.array_equal(sums, want_sums), f"block sums differ ({seed_note})"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [32, 2560, 10240, 6144 + 32])
def test_quantize_matches_reference(rng, n):
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-10, 10, n))).astype(np.float32)
    _check_exact(x, f"n={n}")


@pytest.mark.gpu
def test_quantize_ties_zero_blocks_and_tiny_blocks(rng):
    ties = rng.integers(-126, 126, 32).astype(np.float32) + np.float32(0.5)  # dx = 1: exact .5 ties
    ties[0] = 127.0
    zero = np.zeros(32, np.float32)
    tiny = (rng.standard_normal(32) * 1e-40).astype(np.float32)  # subnormal: dx may underflow to 0
    mixed = rng.standard_normal(32).astype(np.float32)
    x = np.concatenate([ties, -ties, zero, tiny, mixed])
    _check_exact(x, "ties/zero/tiny")
    xq, _, _ = _native_check.quantize_q8_32(ties)
    assert xq[1] == np.trunc(ties[1]) + np.sign(ties[1]), "a .5 tie must round away from zero"


@pytest.mark.gpu
def test_quantize_rejects_partial_block(rng):
    with pytest.raises(strata.InvalidArgument, match="multiple of 32"):
        _native_check.quantize_q8_32(rng.standard_normal(48).astype(np.float32))
