"""GPU matrix products (kernels/matmul.cuh) for every canonical form, dense and in groups over a stack of matrices
(routed experts), vs the GEMV run once per row (the decode path's kernel: the oracle) and the numpy reference, on
fresh random weights and activations at several row counts; the hook's argument checks run without a GPU.

The tolerances are derived, per output, from the magnitudes summed (no fitted constants):
- Quantized forms: the GEMV, numpy (strata.quant.matvec) and the matmul compute the same exact integer group sums
  Σ v xq and Σ xq and the same float32 scales (d * s, m * sm, dx); they differ only in the float32 rounding of
  the scaled terms and of their sum over the nb blocks of a row. Each result is within gamma(nb + 8) * S of the
  exact value, S = Σ_i (|d s v_i| + |m sm|) |dx xq_i| (each block's term takes at most 6 roundings, the sum over
  blocks at most nb - 1 more in any order; gamma(n) = n u / (1 - n u), u = 2^-24), so two of them differ by at
  most twice that.
- Float forms: the matmul multiplies bf16 tensor-core operands split as v = hi + lo (matmul_float.cu): the split
  drops at most 3.02 * 2^-16 |w| |x| per product (f32 weights; less for f16, bf16); a stage's three mma over
  16 columns add exact bf16 products in float32 with truncating adders of a few guard bits (as published
  measurements of NVIDIA's tensor cores found), here allowed 2^-17 of the stage's magnitudes, generously; the
  float32 sum over the ceil(cols / 16) stages adds gamma(stages + 2). Against the exact (float64) product the
  matmul is within (4 * 2^-16 + 2^-17 + gamma(stages + 2)) S, S = Σ |w x|. The GEMV's float32 FMA chains of at most
  cols / 32 + 8 steps are within gamma(cols / 32 + 8) S of it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from support.hooks import native_check as _native_check
from strata.quant import QuantTensor, dequantize, matvec, quantize_activation, repack
from strata.quant.dequant import group_offsets, group_scales, unpack_codes
from strata.quant.forms import FORMS
from strata.quant.synthetic import random_blocks

pytestmark = pytest.mark.hooks

QUANT_TYPES = [t for t, f in FORMS.items() if not f.is_float]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
ROW_COUNTS = [1, 7, 64, 300]
POISON_BITS = np.uint32(0xFFFFFFFF)
UNIT = 2.0**-24


def gamma(n: int) -> float:
    return n * UNIT / (1 - n * UNIT)


def random_weight(ggml_type: T, rows: int, cols: int, rng: np.random.Generator):
    return repack(random_blocks(ggml_type, rows * cols, rng), ggml_type, (cols, rows))


def random_x(count: int, x_stride: int, rng: np.random.Generator) -> np.ndarray:
    """Activations [count, x_stride], every entry (the padding past cols too) finite and nonzero."""
    return rng.standard_normal((count, x_stride)).astype(np.float32)


def quant_terms(q: QuantTensor, x: np.ndarray) -> np.ndarray:
    """S [count, rows] = Σ_i (|d s v_i| + |m sm|) |dx xq_i| in float64, for x [count, cols]."""
    group = q.form.group_size
    values = np.abs(q.form.values().astype(np.float64))[unpack_codes(q.form, q.codes)]
    magnitude = (values.reshape(q.rows, -1, group) * np.abs(group_scales(q).astype(np.float64))[:, :, None])
    offsets = group_offsets(q)
    if offsets is not None:
        magnitude += np.abs(offsets.astype(np.float64))[:, :, None]
    xq, dx, _ = quantize_activation(x)
    x_hat = np.abs(xq.astype(np.float64)).reshape(len(x), -1, 32) * np.abs(dx.astype(np.float64))[:, :, None]
    return x_hat.reshape(len(x), -1) @ magnitude.reshape(q.rows, -1).T


def float_terms(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """S [count, rows] = Σ |w x| in float64, for x [count, cols]."""
    return np.abs(x.astype(np.float64)) @ np.abs(dequantize(w).astype(np.float64)).T


def float_bounds(cols: int) -> tuple[float, float]:
    """(matmul, GEMV) error bounds against the exact product, relative to S (the module docstring)."""
    stages = math.ceil(cols / 16)
    return 4 * 2.0**-16 + 2.0**-17 + gamma(stages + 2), gamma(cols // 32 + 8)


def check_close(got: np.ndarray, want: np.ndarray, bound: np.ndarray, note: str) -> None:
    assert got.shape == want.shape, f"{note}: shape {got.shape}, expected {want.shape}"
    assert np.all(np.isfinite(got)), f"{note}: {np.count_nonzero(~np.isfinite(got))} outputs not finite"
    excess = np.abs(got.astype(np.float64) - want) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (f"{note}: output {worst} is {got[worst]!r}, expected {want[worst]!r} within "
                                f"{bound[worst]:.3e}")


def check_unwritten(y: np.ndarray, mask: np.ndarray, note: str) -> None:
    """The entries of y under `mask` keep the hook's poison (NaN bits): the product never wrote them."""
    written = np.count_nonzero(y[mask].view(np.uint32) != POISON_BITS)
    assert written == 0, f"{note}: {written} entries the product must not write were written"


def references(w, x: np.ndarray, slots_of_rows: np.ndarray, n_matrix: int) -> tuple[np.ndarray, ...]:
    """For x [count, x_stride] and the matrix of every row (-1: none): the GEMV per row, the numpy reference, and
    the error bounds of the matmul, the GEMV and the reference against the exact product, each [count, rows];
    rows of no matrix are NaN in all but the GEMV's (which leaves them unwritten, NaN too)."""
    quantized = isinstance(w, QuantTensor)
    stack_rows, cols = (w.rows, w.cols) if quantized else w.shape
    rows = stack_rows // n_matrix
    gemv = _native_check.gemv_batch(w, n_matrix, slots_of_rows, x)
    want, mm_bound, gemv_bound, want_bound = (np.full((len(x), rows), np.nan) for _ in range(4))
    for m in np.unique(slots_of_rows[slots_of_rows >= 0]):
        chosen = np.flatnonzero(slots_of_rows == m)
        matrix = _rows_of(w, np.arange(m * rows, (m + 1) * rows))
        xm = np.ascontiguousarray(x[chosen, :cols])
        if quantized:  # three float32 computations of one exact value
            want[chosen] = matvec(matrix, xm)
            mm_bound[chosen] = gemv_bound[chosen] = want_bound[chosen] = gamma(cols // 32 + 8) * quant_terms(matrix, xm)
        else:  # the reference is float64: its error is below 2^-40 of S
            want[chosen] = xm.astype(np.float64) @ dequantize(matrix).astype(np.float64).T
            terms = float_terms(matrix, xm)
            mm_rel, gemv_rel = float_bounds(cols)
            mm_bound[chosen], gemv_bound[chosen] = mm_rel * terms, gemv_rel * terms
            want_bound[chosen] = 2.0**-40 * terms
    return gemv, want, mm_bound, gemv_bound, want_bound


def _rows_of(w, chosen: np.ndarray):
    if not isinstance(w, QuantTensor):
        return w[chosen]
    return QuantTensor(w.form, len(chosen), w.cols, **{name: plane[chosen] for name, plane in w.planes().items()})


def check_product(w, y: np.ndarray, x: np.ndarray, slots_of_rows: np.ndarray, n_matrix: int, note: str) -> None:
    """y [count, y_stride] of matmul or matmul_grouped against the GEMV per row and numpy, and its poison."""
    gemv, want, mm_bound, gemv_bound, want_bound = references(w, x, slots_of_rows, n_matrix)
    rows = want.shape[1]
    live = slots_of_rows >= 0
    check_close(y[live, :rows], want[live], mm_bound[live] + want_bound[live], f"{note} vs numpy")
    check_close(y[live, :rows], gemv[live].astype(np.float64), mm_bound[live] + gemv_bound[live], f"{note} vs GEMV")
    check_unwritten(y, np.broadcast_to(~live[:, None], y.shape), f"{note}, rows of no group")
    check_unwritten(y[:, rows:], np.ones_like(y[:, rows:], dtype=bool), f"{note}, the gaps past the rows")


def check_dense(w, count: int, x_pad: int, y_pad: int, rng: np.random.Generator) -> None:
    rows, cols = (w.rows, w.cols) if isinstance(w, QuantTensor) else w.shape
    x = random_x(count, cols + x_pad, rng)
    y = _native_check.matmul(w, x, y_stride=rows + y_pad)
    assert y.shape == (count, rows + y_pad) and y.dtype == np.float32
    name = w.form.name if isinstance(w, QuantTensor) else str(w.dtype)
    check_product(w, y, x, np.zeros(count, np.int32), 1, f"{name} {rows}x{cols}, {count} rows")


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("count", ROW_COUNTS)
def test_quant_matmul_every_form(rng, ggml_type, count):
    """200 weight rows (a tile and a part), x rows padded by a block, y rows by 3."""
    check_dense(random_weight(ggml_type, 200, 512, rng), count, 32, 3, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols"), [(640, 2560), (2560, 640), (1000, 2560), (48, 6144)])
def test_quant_matmul_model_shapes(rng, ggml_type, rows, cols):
    """The benchmark model's forms at expert and projection shapes (Q4_K needs whole 256-column super-blocks)."""
    if cols % FORMS[ggml_type].super_size:
        pytest.skip(f"{ggml_type.name} rows are whole {FORMS[ggml_type].super_size}-column super-blocks")
    check_dense(random_weight(ggml_type, rows, cols, rng), 130, 0, 0, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("count", ROW_COUNTS)
@pytest.mark.parametrize(("rows", "cols", "x_pad"), [(200, 512, 4), (7, 33, 0), (300, 100, 0), (130, 2560, 1)],
                         ids=["vector", "scalar", "vector_part_stage", "scalar_stride"])
def test_float_matmul(rng, ggml_type, count, rows, cols, x_pad):
    """Vector loads (cols and x_stride multiples of 4) and the scalar path, a stage cut by cols."""
    check_dense(random_weight(ggml_type, rows, cols, rng), count, x_pad, 2, rng)


def random_groups(n_matrix: int, n_groups: int, most: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(slots, begin, rows of x) for groups of up to `most` rows: unwritten rows before the first group and after
    the last, an empty group, a skipped one (-1), a matrix used twice, groups of 1 row and of two tiles and a row."""
    slots = rng.integers(0, n_matrix, size=n_groups).astype(np.int32)
    slots[rng.permutation(n_groups)[:3]] = [-1, *(2 * [rng.integers(n_matrix)])]
    sizes = rng.integers(0, most + 1, size=n_groups)
    sizes[rng.permutation(n_groups)[:3]] = [0, 1, 129]
    begin = np.concatenate([[0], np.cumsum(sizes)]) + 5
    return slots, begin.astype(np.int32), int(begin[-1]) + 7


def slots_of_rows(slots: np.ndarray, begin: np.ndarray, count: int) -> np.ndarray:
    per_row = np.full(count, -1, np.int32)
    for g, slot in enumerate(slots):
        per_row[begin[g]:begin[g + 1]] = slot
    return per_row


def check_grouped(stack, n_matrix: int, n_groups: int, most: int, rng: np.random.Generator) -> None:
    stack_rows, cols = (stack.rows, stack.cols) if isinstance(stack, QuantTensor) else stack.shape
    rows = stack_rows // n_matrix
    slots, begin, count = random_groups(n_matrix, n_groups, most, rng)
    x = random_x(count, cols + 32, rng)
    y = _native_check.matmul_grouped(stack, n_matrix, slots, begin, x, y_stride=rows + 1)
    name = stack.form.name if isinstance(stack, QuantTensor) else str(stack.dtype)
    note = f"{name} {n_matrix} x {rows}x{cols}, groups {np.diff(begin).tolist()} of slots {slots.tolist()}"
    check_product(stack, y, x, slots_of_rows(slots, begin, count), n_matrix, note)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_grouped_matmul_every_form(rng, ggml_type):
    check_grouped(random_weight(ggml_type, 6 * 150, 256, rng), 6, 9, 149, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q8_0, T.BF16], ids=lambda t: t.name)
def test_grouped_matmul_expert_shape(rng, ggml_type):
    """A layer's routed experts, 640 x 2560: more groups than a CTA's threads search in one pass."""
    check_grouped(random_weight(ggml_type, 4 * 640, 2560, rng), 4, 300, 4, rng)


# Refusals the hook makes before it touches a device: these run without a GPU.
def test_matmul_refuses_bad_strides_without_a_device(rng):
    q = random_weight(T.Q8_0, 8, 256, rng)
    with pytest.raises(strata.InvalidArgument, match=r"x_stride at least cols \(256\) and a multiple of 32, got 260"):
        _native_check.matmul(q, np.zeros((2, 260), np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"y_stride at least rows \(8\), got 7"):
        _native_check.matmul(q, np.zeros((2, 256), np.float32), y_stride=7)
    w = random_weight(T.F16, 8, 40, rng)
    with pytest.raises(strata.InvalidArgument, match=r"matmul_float needs x_stride at least cols \(40\), got 39"):
        _native_check.matmul(w, np.zeros((2, 39), np.float32))


def test_matmul_refuses_bad_groups_without_a_device(rng):
    q = random_weight(T.Q4_K, 4 * 8, 256, rng)
    x = np.zeros((10, 256), np.float32)
    with pytest.raises(strata.InvalidArgument, match=r"slots\[1\] = 4 lies outside the stack of 4 matrices"):
        _native_check.matmul_grouped(q, 4, [0, 4], [0, 2, 4], x)
    with pytest.raises(strata.InvalidArgument, match=r"begin\[2\] = 3 breaks 0 <= begin\[0\] <= \.\.\."):
        _native_check.matmul_grouped(q, 4, [0, 1], [0, 5, 3], x)
    with pytest.raises(strata.InvalidArgument, match=r"begin\[2\] = 11 breaks .* <= x rows \(10\)"):
        _native_check.matmul_grouped(q, 4, [0, 1], [0, 5, 11], x)
    with pytest.raises(strata.InvalidArgument, match=r"begin\[0\] = -1 breaks"):
        _native_check.matmul_grouped(q, 4, [0, 1], [-1, 5, 9], x)
    with pytest.raises(strata.InvalidArgument, match="2 slots need 3 begin entries, got 2"):
        _native_check.matmul_grouped(q, 4, [0, 1], [0, 5], x)


def test_matmul_refuses_more_rows_than_its_grid_without_a_device(rng):
    q = random_weight(T.Q4_0, 4, 32, rng)
    groups = 65000
    most = (65535 - groups + 1) * 64 - 1
    x = np.zeros((most + 1, 32), np.float32)
    begin = np.zeros(groups + 1, np.int32)
    with pytest.raises(strata.InvalidArgument, match=rf"1 <= x rows <= {most} \({groups} groups\), got {most + 1}"):
        _native_check.matmul_grouped(q, 1, np.zeros(groups, np.int32), begin, x)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.F16], ids=lambda t: t.name)
def test_time_matmul_dense_and_grouped(rng, ggml_type):
    """benchmarks/bench_matmul.py's timing hook: a positive time, dense and over groups of a stack."""
    stack = random_weight(ggml_type, 4 * 128, 256, rng)
    assert 0 < _native_check.time_matmul(stack, 4, 100, reps=2) < 1
    assert 0 < _native_check.time_matmul(stack, 4, 160, groups=8, reps=2) < 1


def test_time_matmul_refuses_unequal_groups_without_a_device(rng):
    stack = random_weight(T.Q8_0, 4 * 8, 256, rng)
    with pytest.raises(strata.InvalidArgument, match="timing needs groups >= 0 dividing the rows, got 3 groups"):
        _native_check.time_matmul(stack, 4, 100, groups=3, reps=2)
