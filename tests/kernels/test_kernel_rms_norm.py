"""The first kernel through the whole chain: CMake-built CUDA, called through Cython, checked vs numpy."""

import numpy as np
import pytest

import strata
from support.q8_form import assert_q8_of
from strata import _native
from support.hooks import native_check as _native_check

pytestmark = pytest.mark.hooks

# float32 accumulation over up to 10240 squares: relative error well under 1e-5 of the output scale.
RTOL = 1e-5


def rms_norm_reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "cols"), [(1, 128), (7, 2560), (33, 10240), (4, 1000), (2, 31)])
def test_rms_norm_matches_numpy(rng, rows, cols):
    x = rng.standard_normal((rows, cols), dtype=np.float32) * rng.uniform(0.1, 10.0)
    w = rng.standard_normal(cols, dtype=np.float32)
    got = _native_check.rms_norm(x, w, 1e-6)
    want = rms_norm_reference(x, w, 1e-6)
    assert np.all(np.isfinite(got))
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err < RTOL, f"max relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "cols"), [(1, 2560), (1, 2048), (3, 1024), (2, 32)])
def test_rms_norm_writes_the_q8_form_of_its_output(rng, rows, cols):
    """The plain norm before a quantized projection writes x's q8_32 form beside x: the output is the same bits as
    without it, the form quantize_q8_32 of that output."""
    x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(rng.uniform(0.1, 10.0))
    w = rng.standard_normal(cols, dtype=np.float32)
    got, q8 = _native_check.rms_norm(x, w, 1e-6, q8=True)
    assert np.array_equal(got.view(np.uint32), _native_check.rms_norm(x, w, 1e-6).view(np.uint32))
    assert_q8_of(got, q8, f"rms_norm {rows}x{cols}")


def test_rms_norm_q8_form_needs_whole_blocks(rng):
    x = rng.standard_normal((32, 31), dtype=np.float32)  # 992 floats, but rows of 31: no row is whole blocks
    with pytest.raises(strata.InvalidArgument, match="rms_norm: a q8_32 output needs cols a multiple of 32, got 31"):
        _native_check.rms_norm(x, np.ones(31, np.float32), 1e-6, q8=True)


@pytest.mark.gpu
def test_rms_norm_rejects_mismatched_weight(rng):
    with pytest.raises(strata.InvalidArgument, match="weight has 3 entries, rows have 4"):
        _native_check.rms_norm(rng.standard_normal((2, 4), dtype=np.float32), np.ones(3, np.float32), 1e-6)


def test_rms_norm_without_a_device_says_so(rng):
    if _native.device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(strata.InvalidArgument, match="no CUDA device"):
        _native_check.rms_norm(rng.standard_normal((2, 4), dtype=np.float32), np.ones(4, np.float32), 1e-6)
