"""GPU GEMV for every canonical form (docs/forms.md) vs strata.quant.matvec, the numpy reference of the
same integer math, on fresh random GGUF blocks; float forms vs float64 numpy."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from strata import _native_check
from strata.quant import QuantTensor, dequantize, form_for, matvec, repack
from strata.quant.forms import FORMS
from strata.quant.synthetic import random_blocks

QUANT_TYPES = [t for t, f in FORMS.items() if not f.is_float]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
# Every bound is relative to max_r sum_j |w_rj x_j|, the size of the terms summed: max |y| alone can be tiny
# when a row's terms cancel (a 1 x 32 row did, on one seed), and summation-order error scales with the terms.
# Quantized: integer inner sums are exact on both sides; only the float32 scaling and the order of the sums
# over blocks differ (numpy: pairwise, GPU: per lane then a warp tree), a few float32 roundings.
QUANT_RTOL = 2e-6
# Float weights: fp32 FMA accumulation over up to 10240 products vs a float64 reference.
FLOAT_RTOL = 1e-5


def random_weight(ggml_type: T, rows: int, cols: int, rng: np.random.Generator):
    return repack(random_blocks(ggml_type, rows * cols, rng), ggml_type, (cols, rows))


def error_of_terms(got: np.ndarray, want: np.ndarray, w, x: np.ndarray) -> float:
    """max |got - want| / max_r sum_j |w_rj x_j| (w: a QuantTensor or float weight, as gemv takes it)."""
    assert np.all(np.isfinite(got)), f"{np.count_nonzero(~np.isfinite(got))} non-finite outputs"
    scale = np.max(np.abs(dequantize(w)).astype(np.float64) @ np.abs(x).astype(np.float64))
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(scale, 1e-30))


def check_quant(ggml_type: T, rows: int, cols: int, rng: np.random.Generator) -> None:
    q = random_weight(ggml_type, rows, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    err = error_of_terms(_native_check.gemv(q, x), matvec(q, x), q, x)
    assert err < QUANT_RTOL, f"{ggml_type.name} {rows}x{cols}: max error {err:.2e} of max sum |w x|"


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols"), [(1, 256), (7, 512), (33, 2560), (320, 10240)])
def test_quant_gemv_every_form(rng, ggml_type, rows, cols):
    check_quant(ggml_type, rows, cols, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_0, T.IQ4_NL, T.Q5_1], ids=lambda t: t.name)
def test_quant_gemv_rank_320_input(rng, ggml_type):
    """The HC up projection (320 -> 10240): rows narrower than a K-quant super-block."""
    check_quant(ggml_type, 10240, 320, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.Q2_K], ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols"), [(10240, 2560), (12288, 2560), (2560, 6144), (512, 2560), (2561, 256)])
def test_quant_gemv_qwen4exp_projections(rng, ggml_type, rows, cols):
    check_quant(ggml_type, rows, cols, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (7, 33), (48, 2560), (2560, 6144), (10240, 320), (5, 10240)])
def test_float_gemv(rng, ggml_type, rows, cols):
    w = random_weight(ggml_type, rows, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    want = dequantize(w).astype(np.float64) @ x.astype(np.float64)
    err = error_of_terms(_native_check.gemv(w, x), want, w, x)
    assert err < FLOAT_RTOL, f"{ggml_type.name} {rows}x{cols}: max error {err:.2e} of max sum |w x|"


def _row_slice(q: QuantTensor, rows: np.ndarray) -> QuantTensor:
    planes = {name: plane[rows] for name, plane in q.planes().items()}
    return QuantTensor(q.form, len(rows), q.cols, **planes)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_lm_head(rng, ggml_type):
    """qwen4exp's LM head, 2560 -> 248320: every output finite, a random sample of rows checked."""
    rows, cols = 248320, 2560
    w = random_weight(ggml_type, rows, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    y = _native_check.gemv(w, x)
    assert y.shape == (rows,) and np.all(np.isfinite(y))
    sample = np.sort(np.concatenate([rng.choice(rows - 1, 2048, replace=False), [rows - 1]]))
    if isinstance(w, np.ndarray):
        rows_checked = w[sample]
        want, rtol = rows_checked.astype(np.float64) @ x.astype(np.float64), FLOAT_RTOL
    else:
        rows_checked = _row_slice(w, sample)
        want, rtol = matvec(rows_checked, x), QUANT_RTOL
    err = error_of_terms(y[sample], want, rows_checked, x)
    assert err < rtol, f"{ggml_type.name} LM head: max error {err:.2e} of max sum |w x|"


@pytest.mark.gpu
def test_gemv_rejects_wrong_x_length(rng):
    q = random_weight(T.Q8_0, 4, 64, rng)
    with pytest.raises(strata.InvalidArgument, match="x has 32 elements, the weight has 64 columns"):
        _native_check.gemv(q, rng.standard_normal(32).astype(np.float32))


@pytest.mark.gpu
def test_gemv_rejects_unknown_float_dtype(rng):
    with pytest.raises(strata.InvalidArgument, match="float64"):
        _native_check.gemv(rng.standard_normal((4, 64)), rng.standard_normal(64).astype(np.float32))


def test_every_quant_type_has_a_form():
    assert {form_for(t).name for t in QUANT_TYPES} >= {"q8_0", "q4_k", "q6_k", "mxfp4", "iq4_xs", "q2_k"}
