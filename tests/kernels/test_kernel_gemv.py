"""GPU GEMV for every canonical form (docs/forms.md) vs strata.quant.matvec, the numpy reference of the
same integer math, on fresh random GGUF blocks; float forms vs float64 numpy. The batched GEMV over a stack of
matrices (a layer's experts in VRAM) vs the single GEMV, bit for bit, and the same references."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from support.hooks import native_check as _native_check
from strata.quant import QuantTensor, dequantize, form_for, matvec, repack
from strata.quant.forms import FORMS
from strata.quant.synthetic import random_blocks

pytestmark = pytest.mark.hooks

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


# The batched GEMV over a stack of matrices (gemv_batch, a layer's experts held in VRAM): each written product
# must be the single-matrix GEMV of its matrix bit for bit (the same kernel loop), and so within the single
# GEMV's bounds of the numpy reference; a skipped product's row keeps the poison's bits.
POISON_BITS = np.uint32(0xFFFFFFFF)


def matrix_of(stack, m: int, rows: int):
    """Matrix m of a stack of matrices of `rows` rows each (a QuantTensor or a float array)."""
    chosen = np.arange(m * rows, (m + 1) * rows)
    return stack[chosen] if isinstance(stack, np.ndarray) else _row_slice(stack, chosen)


def random_slots(n_matrix: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """count slots in random order: at least one skip (-1) and one matrix used twice, the rest any of -1..n-1."""
    slots = rng.integers(-1, n_matrix, size=count)
    slots[rng.permutation(count)[:3]] = [-1, *(2 * [rng.integers(n_matrix)])]
    return slots.astype(np.int32)


def batch_x(cols: int, count: int, x_stride: int, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """x as gemv_batch takes it (shared for x_stride 0, else [count, x_stride] with random padding), and x_j."""
    if x_stride == 0:
        x = rng.standard_normal(cols).astype(np.float32)
        return x, [x] * count
    x = rng.standard_normal((count, x_stride)).astype(np.float32)
    return x, [np.ascontiguousarray(x[j, :cols]) for j in range(count)]


def check_batch(stack, n_matrix: int, count: int, x_stride: int, rng: np.random.Generator, *,
                bitwise: bool = True) -> None:
    rows = (stack.shape[0] if isinstance(stack, np.ndarray) else stack.rows) // n_matrix
    cols = stack.shape[1] if isinstance(stack, np.ndarray) else stack.cols
    quantized = not isinstance(stack, np.ndarray)
    slots = random_slots(n_matrix, count, rng)
    x, x_of = batch_x(cols, count, x_stride, rng)
    y = _native_check.gemv_batch(stack, n_matrix, slots, x)
    assert y.shape == (count, rows) and y.dtype == np.float32
    for j, slot in enumerate(slots):
        note = f"product {j} (slot {slot} of {n_matrix}, {rows}x{cols}, x_stride {x_stride})"
        if slot < 0:
            assert np.all(y[j].view(np.uint32) == POISON_BITS), f"skipped {note} was written"
            continue
        w = matrix_of(stack, slot, rows)
        want = matvec(w, x_of[j]) if quantized else dequantize(w).astype(np.float64) @ x_of[j].astype(np.float64)
        err = error_of_terms(y[j], want, w, x_of[j])
        rtol = QUANT_RTOL if quantized else FLOAT_RTOL
        assert err < rtol, f"{note}: max error {err:.2e} of max sum |w x|"
        if bitwise:
            single = _native_check.gemv(w, x_of[j])
            differ = np.count_nonzero(y[j].view(np.uint32) != single.view(np.uint32))
            assert differ == 0, f"{note}: {differ} rows differ from the single-matrix GEMV's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("x_stride", [0, 512, 512 + 64], ids=["x_shared", "x_per_product", "x_padded"])
def test_quant_gemv_batch_every_form(rng, ggml_type, x_stride):
    check_batch(random_weight(ggml_type, 5 * 7, 512, rng), 5, 6, x_stride, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("cols", "x_stride"), [(512, 0), (512, 512), (512, 516), (33, 0), (33, 35)],
                         ids=["vec_x_shared", "vec_x_per_product", "vec_x_padded", "scalar_x_shared", "scalar_x_odd"])
def test_float_gemv_batch(rng, ggml_type, cols, x_stride):
    check_batch(random_weight(ggml_type, 5 * 7, cols, rng), 5, 6, x_stride, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_gemv_batch_unaligned_x_stride(rng, ggml_type):
    """An x_stride that is no multiple of 4 floats takes the scalar loop for the whole batch: right within the
    float bound, but summed in another order than the single GEMV's 16-byte loop, so not compared bit for bit."""
    check_batch(random_weight(ggml_type, 4 * 9, 512, rng), 4, 5, 515, rng, bitwise=False)


# The routed experts of one layer (640 x 2560 gate and up, 1280 x 2560 merged gate_up, 2560 x 640 down) in forms
# the converters give them; the down shape's 640 columns take only the 32-element super-block forms.
EXPERT_SHAPES = [(640, 2560, 0), (1280, 2560, 0), (2560, 640, 640)]
EXPERT_CASES = [(t, rows, cols, x_stride) for rows, cols, x_stride in EXPERT_SHAPES
                for t in [T.Q8_0, T.Q4_K, T.Q6_K, T.IQ4_XS, T.Q2_K, T.MXFP4, T.IQ4_NL, T.Q5_1, T.BF16, T.F16]
                if FORMS[t].is_float or cols % FORMS[t].super_size == 0]


@pytest.mark.gpu
@pytest.mark.parametrize(("ggml_type", "rows", "cols", "x_stride"), EXPERT_CASES,
                         ids=lambda v: v.name if isinstance(v, T) else str(v))
def test_gemv_batch_expert_shapes(rng, ggml_type, rows, cols, x_stride):
    check_batch(random_weight(ggml_type, 24 * rows, cols, rng), 24, 10, x_stride, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_a_batch_of_short_rows_takes_several_a_warp_and_keeps_the_bits(rng, ggml_type):
    """Rows of fewer blocks than a warp's lanes, one warp a row by the rule (2,048 rows or more): a warp takes 4 of
    them; 2,051 rows leave the last warp of each product 3, whose fourth it must not store."""
    if 256 % FORMS[ggml_type].super_size:
        pytest.skip(f"{ggml_type.name} needs columns in {FORMS[ggml_type].super_size}s")
    check_batch(random_weight(ggml_type, 3 * 2051, 256, rng), 3, 5, 256, rng)


# Refusals the hook makes before it touches a device: these run without a GPU.
def test_gemv_batch_refuses_bad_counts_without_a_device(rng):
    q = random_weight(T.Q8_0, 4 * 8, 256, rng)
    x = rng.standard_normal(256).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="gemv_quant_batch needs 1 <= count <= 65535 products, got 0"):
        _native_check.gemv_batch(q, 4, np.zeros(0, np.int32), x)
    with pytest.raises(strata.InvalidArgument, match="count <= 65535 products, got 65536"):
        _native_check.gemv_batch(q, 4, np.zeros(65536, np.int32), x)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.F16], ids=lambda t: t.name)
def test_gemv_batch_refuses_a_slot_outside_the_stack_without_a_device(rng, ggml_type):
    stack = random_weight(ggml_type, 4 * 8, 256, rng)
    hook = "gemv_float_batch" if isinstance(stack, np.ndarray) else "gemv_quant_batch"
    with pytest.raises(strata.InvalidArgument, match=rf"{hook}: slots\[2\] = 4 lies outside the stack of 4 matrices"):
        _native_check.gemv_batch(stack, 4, [0, -1, 4, 1], rng.standard_normal(256).astype(np.float32))


def test_gemv_batch_refuses_bad_x_strides_without_a_device(rng):
    q = random_weight(T.Q8_0, 4 * 8, 256, rng)
    with pytest.raises(strata.InvalidArgument, match=r"at least cols \(256\) and a multiple of 32, got 260"):
        _native_check.gemv_batch(q, 4, [0, 1], np.zeros((2, 260), np.float32))
    w = random_weight(T.F32, 2 * 3, 40, rng)
    with pytest.raises(strata.InvalidArgument,
                       match=r"gemv_float_batch needs x_stride 0 or at least cols \(40\), got 20"):
        _native_check.gemv_batch(w, 2, [0, 1], np.zeros((2, 20), np.float32))


def test_gemv_batch_refuses_a_stack_of_unequal_matrices(rng):
    q = random_weight(T.Q8_0, 10, 256, rng)
    with pytest.raises(strata.InvalidArgument, match="a stack of 10 rows is not 4 matrices of equal rows"):
        _native_check.gemv_batch(q, 4, [0], rng.standard_normal(256).astype(np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"x has shape \(3, 256\); expected \(256,\) or \(2, x_stride\)"):
        _native_check.gemv_batch(q, 5, [0, 1], np.zeros((3, 256), np.float32))


# The multi-input GEMV (gemv_inputs: one matrix, up to 16 activations, each weight block decoded once for all):
# each input's row must be the single GEMV of that input bit for bit (the same walk per input), and so within
# the single GEMV's bounds of the numpy reference. A float weight (gemv_float_inputs) likewise.
def check_inputs(q, inputs: int, x_stride: int, rng: np.random.Generator, kernel: str = "chosen") -> None:
    quantized = not isinstance(q, np.ndarray)
    rows, cols = (q.rows, q.cols) if quantized else q.shape
    x = rng.standard_normal((inputs, x_stride)).astype(np.float32)
    y = _native_check.gemv_inputs(q, x, kernel=kernel)
    assert y.shape == (inputs, rows) and y.dtype == np.float32
    for i in range(inputs):
        xi = np.ascontiguousarray(x[i, :cols])
        note = f"input {i} of {inputs} ({rows}x{cols}, x_stride {x_stride}, kernel {kernel})"
        want = matvec(q, xi) if quantized else dequantize(q).astype(np.float64) @ xi.astype(np.float64)
        err = error_of_terms(y[i], want, q, xi)
        assert err < (QUANT_RTOL if quantized else FLOAT_RTOL), f"{note}: max error {err:.2e} of max sum |w x|"
        single = _native_check.gemv(q, xi)
        differ = np.count_nonzero(y[i].view(np.uint32) != single.view(np.uint32))
        assert differ == 0, f"{note}: {differ} rows differ from the single GEMV's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("inputs", "x_stride"), [(1, 512), (2, 512), (3, 512), (5, 512 + 64), (8, 512 + 64)])
def test_quant_gemv_inputs_every_form(rng, ggml_type, inputs, x_stride):
    check_inputs(random_weight(ggml_type, 37, 512, rng), inputs, x_stride, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols", "inputs"), [(16384, 2560, 8), (2560, 6144, 5), (512, 2560, 2),
                                                      (640, 2560, 7), (2560, 640, 4)])
def test_quant_gemv_inputs_step_shapes(rng, ggml_type, rows, cols, inputs):
    """A step's dense shapes (every row split of gemv_rows.cuh: 1, 2 and 4 warps a row) at row counts a step has."""
    if cols % FORMS[ggml_type].super_size:
        pytest.skip(f"{ggml_type.name} needs columns in {FORMS[ggml_type].super_size}s")
    check_inputs(random_weight(ggml_type, rows, cols, rng), inputs, cols, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols", "inputs"), [(512, 2560, 8), (512, 2560, 16), (3000, 64, 3), (1500, 512, 5),
                                                      (37, 40, 2), (37, 33, 9), (5, 512, 12)])
def test_float_gemv_inputs(rng, ggml_type, rows, cols, inputs):
    """A step's float products (the router's 512 x 2560 at 8 and 16 rows) at every row split of gemv_rows.cuh (1, 2
    and 4 warps a row), on the 16-byte loop and the scalar one (33 columns), each input the single GEMV's bits."""
    check_inputs(random_weight(ggml_type, rows, cols, rng), inputs, cols, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8192 + 1, 8192 + 2, 8192 + 3])
@pytest.mark.parametrize("inputs", [2, 4, 8])
def test_quant_gemv_inputs_rows_short_of_a_warps_rows(rng, rows, inputs):
    """On a tall matrix (8,192 rows or more) a warp takes 2 or 4 weight rows: a last warp's share short of them
    stores only its own."""
    check_inputs(random_weight(T.Q8_0, rows, 64, rng), inputs, 64, rng)


# The tensor-core kernel (kernels/gemv_quant_mma.cuh) keeps the single GEMV's float order, so the same bits: at every
# row split of gemv_rows.cuh (1 warp a row from 2,048 rows, 2 from 1,024, 4 below), tiles short of 16 rows, rows
# of fewer blocks than a part's 32 lanes, a last chunk short of 32 blocks, rows wider than a tile's scales took in
# shared memory before they were staged with the codes, every count of inputs, one mma's 8 and two mmas' 16, and
# matrices of more tiles than CTAs fit the device at once, whose CTAs walk several tiles each.
MMA_TYPES = [T.Q8_0, T.Q5_0, T.Q4_0]


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", MMA_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "cols", "inputs"), [(2048, 2560, 8), (2560 + 5, 6144, 3), (1024, 640, 5),
                                                      (1500, 2560, 2), (640, 2560, 8), (37, 64, 7), (16, 1024, 1),
                                                      (250, 11264, 4), (2048, 2560, 16), (1500, 2560, 11),
                                                      (640, 2560, 16), (37, 64, 13), (4096 + 3, 640, 9),
                                                      (64, 163840, 6), (3000, 4160, 12), (16384 + 7, 640, 5),
                                                      (9000 + 9, 1024, 16)])
def test_quant_gemv_inputs_on_the_tensor_cores(rng, ggml_type, rows, cols, inputs):
    check_inputs(random_weight(ggml_type, rows, cols, rng), inputs, cols + 32, rng, kernel="tensor_cores")


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", MMA_TYPES + [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_quant_gemv_inputs_chosen_and_integer_kernels_agree(rng, ggml_type):
    """Whichever kernel the launcher picks for a step's rows, and the integer walk it falls back to, give the same
    bits (both are the single GEMV's)."""
    q = random_weight(ggml_type, 1100, 2560, rng)
    x = rng.standard_normal((6, 2560)).astype(np.float32)
    chosen = _native_check.gemv_inputs(q, x)
    integer = _native_check.gemv_inputs(q, x, kernel="integer")
    differ = np.count_nonzero(chosen.view(np.uint32) != integer.view(np.uint32))
    assert differ == 0, f"{ggml_type.name}: {differ} outputs of the chosen kernel differ from the integer walk's"


def test_gemv_inputs_refusals_without_a_device(rng):
    q = random_weight(T.Q8_0, 8, 256, rng)
    tall = random_weight(T.Q8_0, 2048, 256, rng)  # one warp a row: the tensor cores take it on any device
    with pytest.raises(strata.InvalidArgument, match="gemv_quant_inputs needs 1 <= inputs <= 16, got 17"):
        _native_check.gemv_inputs(tall, np.zeros((17, 256), np.float32))
    with pytest.raises(strata.InvalidArgument, match="gemv_quant_inputs needs 1 <= inputs <= 8, got 9"):
        _native_check.gemv_inputs(q, np.zeros((9, 256), np.float32), kernel="integer")
    with pytest.raises(strata.InvalidArgument, match="gemv_quant_inputs needs 1 <= inputs <= 8, got 9"):
        _native_check.gemv_inputs(random_weight(T.Q4_K, 8, 256, rng), np.zeros((9, 256), np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"at least cols \(256\) and a multiple of 32, got 296"):
        _native_check.gemv_inputs(q, np.zeros((2, 296), np.float32))
    float_weight = random_weight(T.F16, 8, 40, rng)
    with pytest.raises(strata.InvalidArgument, match="gemv_float_inputs needs 1 <= inputs <= 16, got 17"):
        _native_check.gemv_inputs(float_weight, np.zeros((17, 40), np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"gemv_float_inputs needs x_stride at least cols \(40\), got 20"):
        _native_check.gemv_inputs(float_weight, np.zeros((2, 20), np.float32))
    with pytest.raises(strata.InvalidArgument, match="a float weight has one kernel; 'integer'"):
        _native_check.gemv_inputs(float_weight, np.zeros((2, 40), np.float32), kernel="integer")
    with pytest.raises(strata.InvalidArgument, match="kernel 'fast' is none of chosen, integer, tensor_cores"):
        _native_check.gemv_inputs(q, np.zeros((2, 256), np.float32), kernel="fast")
    with pytest.raises(strata.InvalidArgument, match="tensor-core kernel takes Q8_0, Q5_0 and Q4_0 .* not this form "
                                                     "at 256 columns"):
        _native_check.gemv_inputs(random_weight(T.Q4_K, 8, 256, rng), np.zeros((2, 256), np.float32),
                                  kernel="tensor_cores")
    with pytest.raises(strata.InvalidArgument, match="even count of 32-element blocks a row; not this form at 96 "):
        _native_check.gemv_inputs(random_weight(T.Q8_0, 2048, 96, rng), np.zeros((2, 96), np.float32),
                                  kernel="tensor_cores")


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 4])
def test_a_batch_at_any_row_split_stays_within_the_bounds(rng, split):
    """A batch's products at each row split a benchmark may force (bench_gemv_batch.py): another order of the same
    sums, so within the single GEMV's bound of the reference, not its bits."""
    q = random_weight(T.Q4_K, 4 * 640, 2560, rng)
    x = rng.standard_normal((6, 2560)).astype(np.float32)
    slots = np.array([0, 3, 1, 2, 3, 0], np.int32)
    y = _native_check.gemv_batch(q, 4, slots, x, split=split)
    for j, slot in enumerate(slots):
        w = matrix_of(q, int(slot), 640)
        assert error_of_terms(y[j], matvec(w, x[j]), w, x[j]) < QUANT_RTOL


def test_gemv_batch_refuses_a_split_the_kernels_lack_without_a_device(rng):
    q = random_weight(T.Q8_0, 4 * 8, 256, rng)
    with pytest.raises(strata.InvalidArgument, match="split 0 \\(the rule\\), 1, 2 or 4, got 3"):
        _native_check.time_gemv_batch(q, 4, 4, 3)
    with pytest.raises(strata.InvalidArgument, match="split 0 \\(the rule\\), 1, 2 or 4, got 3"):
        _native_check.gemv_batch(q, 4, [0, 1], np.zeros((2, 256), np.float32), split=3)
