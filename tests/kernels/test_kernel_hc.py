"""The hyper-connection mixer on the GPU (docs/models/qwen4exp.md §3(a)): the read chained from the
grouped RMSNorm, q8_32, GEMV and hc kernels, and the same read fused in two launches (hc_read.cuh, the decode
step's), stage by stage and whole against strata.reference.hc.hc_read with activation_quant weights; the mix
alone and the write-back against hc_write, over rows of tokens in one launch (each row the same bits as a launch
for that token alone, the decode step's rows = 1)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from support.compare import assert_same_bits
from support.q8_form import assert_q8_of

import strata
from support.hooks import native_check as _native_check
from strata.quant import dequantize, matvec, repack
from strata.quant.activation import quantize_activation
from strata.reference.hc import hc_read, hc_write
from strata.reference.ops import grouped_rms_norm, sigmoid, silu
from strata.reference.weights import Weights

pytestmark = pytest.mark.hooks

HC, N, RANK, EPS = 4, 2560, 320, 1e-6
PREFIX = "blk.0.hc_attn"
# Each GEMV vs numpy on the very same float32 input: quantized forms share the exact int32 group sums and
# differ only in float32 scaling and summation order; float forms are float32 sums of <= 10240 products vs
# float64. Either way within 1e-5 of sum_j |w_rj x_j|, the scale such errors are relative to.
GEMV_RTOL = 1e-5
# Whole read vs hc_read with float weights: no activation quantization, so the stages only add float32
# roundings (norm 1e-5 as in test_kernel_norms, GEMVs as above, damped by the sigmoid's slope <= 1/4).
WHOLE_RTOL_FLOAT = 1e-5
# With quantized weights the GPU quantizes its own float32 Hn and lo, which can differ from the reference's
# by an ulp; an input that sits on a q8_32 rounding boundary then moves one code by one step (1/127 of its
# block's max), which shifts a GEMV output by ~1e-3 of its size and x by a few 1e-4 after the sigmoid.
WHOLE_RTOL_QUANT = 2e-3


def weight(ggml_type: T, rows: int, cols: int, gain: float, rng: np.random.Generator):
    """A canonical-form weight from a N(0, gain^2 / cols) matrix: outputs of size ~gain for inputs of size ~1."""
    w = (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)
    raw = w if ggml_type == T.F32 else quants.quantize(w, ggml_type)
    return repack(raw, ggml_type, (cols, rows))


def hc_weights(down_type: T, up_type: T, rng: np.random.Generator, inject_type: T | None = None,
               hc: int = HC, n: int = N, rank: int = RANK) -> dict:
    # Gains put W_down Hn / hc, W_up lo and W_inj Hn / hc near 1, where silu and sigmoid are far from flat.
    return {"down": weight(down_type, rank, hc * n, hc, rng), "up": weight(up_type, hc * n, rank, 2.0, rng),
            "inject": weight(inject_type or down_type, hc, hc * n, hc, rng),
            "norm": (1.0 + 0.1 * rng.standard_normal(hc * n)).astype(np.float32)}


def random_streams(rng: np.random.Generator, hc: int = HC, n: int = N) -> np.ndarray:
    return (rng.standard_normal((hc, n)) * rng.uniform(0.1, 10, (hc, 1))).astype(np.float32)


class CanonicalWeights(Weights):
    """hc_read's weights: dequantized floats for `get`, the canonical forms themselves for the products."""

    def __init__(self, w: dict):
        self._forms = {f"{PREFIX}_{part}.weight": w[part] for part in ("down", "up", "inject")}
        dense = {name: dequantize(form) for name, form in self._forms.items()}
        super().__init__({**dense, f"{PREFIX}_norm.weight": w["norm"]}, activation_quant=True)

    def _canonical(self, name, expert):
        return self._forms[name]


def gemv_reference(w, x: np.ndarray) -> tuple[np.ndarray, float]:
    """W x as the reference's activation contract computes it, and the error scale max_r sum_j |w_rj x_j|."""
    dense = np.abs(dequantize(w)).astype(np.float64)
    scale = float(np.max(dense @ np.abs(x).astype(np.float64)))
    if isinstance(w, np.ndarray):  # float forms: float64, so only the GPU's roundings remain
        return dequantize(w).astype(np.float64) @ x.astype(np.float64), scale
    return matvec(w, x).astype(np.float64), scale


def assert_within(got: np.ndarray, want: np.ndarray, bound: float, what: str) -> None:
    assert np.all(np.isfinite(got)), f"{what}: {np.count_nonzero(~np.isfinite(got))} non-finite values"
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert err <= bound, f"{what}: max error {err:.3e} exceeds {bound:.3e}"


FORMS = [(T.F32, T.F32), (T.BF16, T.BF16), (T.Q8_0, T.Q8_0), (T.Q4_0, T.Q5_1)]
FORM_IDS = [f"{d.name}-{u.name}" for d, u in FORMS]


@pytest.mark.gpu
@pytest.mark.parametrize(("down_type", "up_type"), FORMS, ids=FORM_IDS)
def test_hc_read_stage_by_stage(rng, down_type, up_type):
    """Each stage against numpy applied to the GPU's own previous stage: every q8_32 input is identical."""
    w, h = hc_weights(down_type, up_type, rng), random_streams(rng)
    got = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS)
    want_normed = grouped_rms_norm(h.reshape(1, -1), w["norm"], HC, EPS)[0]
    assert_within(got["normed"], want_normed, 1e-5 * np.max(np.abs(want_normed)), "grouped rms_norm")
    down, down_scale = gemv_reference(w["down"], got["normed"])
    # silu's slope is at most 1.1; the activation itself rounds a few times (1e-6 of its size).
    low = silu(down / HC)
    assert_within(got["low"], low, 1.1 * GEMV_RTOL * down_scale / HC + 1e-6 * np.max(np.abs(low)), "low-rank silu")
    up, up_scale = gemv_reference(w["up"], got["low"])
    mix = sigmoid(up).reshape(HC, N) * got["normed"].reshape(HC, N)
    x = mix.mean(axis=0)
    normed_max = float(np.max(np.abs(got["normed"])))
    assert_within(got["x"], x, 0.25 * GEMV_RTOL * up_scale * normed_max + 1e-6 * np.max(np.abs(mix)), "mix")
    inject, inject_scale = gemv_reference(w["inject"], got["normed"])
    inj = 2 * sigmoid(inject / HC)
    assert_within(got["inj"], inj, 2 * 0.25 * GEMV_RTOL * inject_scale / HC + 1e-6, "inject")


@pytest.mark.gpu
@pytest.mark.parametrize(("down_type", "up_type"), FORMS, ids=FORM_IDS)
def test_hc_read_whole_vs_reference(rng, down_type, up_type):
    w, h = hc_weights(down_type, up_type, rng), random_streams(rng)
    got = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS)
    want_x, want_inj = hc_read(CanonicalWeights(w), PREFIX, h[None], EPS)
    rtol = WHOLE_RTOL_FLOAT if down_type in (T.F32, T.BF16) else WHOLE_RTOL_QUANT
    assert_within(got["x"], want_x[0], rtol * np.max(np.abs(want_x)), f"x ({down_type.name})")
    assert_within(got["inj"], want_inj[0], rtol * 2, f"inj ({down_type.name})")  # inj lies in (0, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["chain", "fused"])
def test_hc_read_without_inject_is_the_final_mixer(rng, fused):
    w, h = hc_weights(T.Q8_0, T.Q8_0, rng), random_streams(rng)
    read = {"eps": EPS, "fused": fused, "q8": fused}
    with_inject = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], **read)
    final = _native_check.hc_read(h, w["norm"], w["down"], w["up"], **read)
    assert "inj" not in final and np.all(np.isfinite(final["x"])), "non-finite x"
    assert np.array_equal(final["x"].view(np.uint32), with_inject["x"].view(np.uint32)), "inject must not change x"
    if fused:
        assert_fused_q8(final)


# The fused read: the chain's forms, down and inject of two forms (two launches of hc_read_down), and F16.
FUSED_FORMS = [(d, u, d) for d, u in FORMS] + [(T.Q8_0, T.Q8_0, T.F32), (T.F16, T.Q4_0, T.BF16)]
FUSED_IDS = [f"{d.name}-{u.name}-{i.name}" for d, u, i in FUSED_FORMS]


def fused_normed(got: dict, h: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """Hn as the fused kernels compute it from their rms, in the same float32 order ((h * rms) * norm)."""
    return ((h * got["rms"][:, None]) * norm.reshape(h.shape)).reshape(-1)


def assert_fused_q8(got: dict) -> None:
    """x's q8_32 form as hc_read_up_mix wrote it: quantize_q8_32's and numpy's of the kernel's x, bit for bit."""
    assert_q8_of(got["x"], got["q8"], "hc_read_up_mix")
    for part, have, want in zip(("xq", "dx", "sums"), got["q8"], quantize_activation(got["x"])):
        assert np.array_equal(have.view(np.uint8 if part == "xq" else np.uint32),
                              want.view(np.uint8 if part == "xq" else np.uint32)), f"{part} differs from numpy's"


def assert_fused_stages(got: dict, w: dict, h: np.ndarray) -> None:
    """Each stage of the fused read against numpy applied to the kernels' own previous stage: every q8_32 input
    is the same bits as the GPU's, so only float32 scaling and summation order remain, at any size."""
    hc, n = h.shape
    want_rms = 1.0 / np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=1) + EPS)
    # Float32 sums of n squares (positive terms, reduced as a tree across lanes and warps) and rsqrtf's 2 ulp.
    assert_within(got["rms"], want_rms, 1e-5 * np.max(want_rms), "inverse rms")
    normed = fused_normed(got, h, w["norm"])
    want_normed = grouped_rms_norm(h.reshape(1, -1), w["norm"], hc, EPS)[0]
    assert_within(normed, want_normed, 1e-5 * np.max(np.abs(want_normed)), "Hn from rms")
    down, down_scale = gemv_reference(w["down"], normed)
    low = silu(down / hc)
    assert_within(got["low"], low, 1.1 * GEMV_RTOL * down_scale / hc + 1e-6 * np.max(np.abs(low)), "low-rank silu")
    up, up_scale = gemv_reference(w["up"], got["low"])
    mix = sigmoid(up).reshape(hc, n) * normed.reshape(hc, n)
    x = mix.mean(axis=0)
    assert_within(got["x"], x, 0.25 * GEMV_RTOL * up_scale * np.max(np.abs(normed)) + 1e-6 * np.max(np.abs(mix)),
                  "mix")
    if "inj" in got:
        inject, inject_scale = gemv_reference(w["inject"], normed)
        inj = 2 * sigmoid(inject / hc)
        assert_within(got["inj"], inj, 2 * 0.25 * GEMV_RTOL * inject_scale / hc + 1e-6, "inject")
    assert_fused_q8(got)


@pytest.mark.gpu
@pytest.mark.parametrize(("down_type", "up_type", "inject_type"), FUSED_FORMS, ids=FUSED_IDS)
def test_hc_read_fused_stage_by_stage(rng, down_type, up_type, inject_type):
    w, h = hc_weights(down_type, up_type, rng, inject_type), random_streams(rng)
    got = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True, q8=True)
    assert_fused_stages(got, w, h)


@pytest.mark.gpu
@pytest.mark.parametrize(("down_type", "up_type", "inject_type"), FUSED_FORMS, ids=FUSED_IDS)
def test_hc_read_fused_whole_vs_reference(rng, down_type, up_type, inject_type):
    w, h = hc_weights(down_type, up_type, rng, inject_type), random_streams(rng)
    got = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True)
    want_x, want_inj = hc_read(CanonicalWeights(w), PREFIX, h[None], EPS)
    floats = (T.F32, T.F16, T.BF16)
    x_rtol = WHOLE_RTOL_FLOAT if down_type in floats and up_type in floats else WHOLE_RTOL_QUANT
    inj_rtol = WHOLE_RTOL_FLOAT if inject_type in floats else WHOLE_RTOL_QUANT
    assert_within(got["x"], want_x[0], x_rtol * np.max(np.abs(want_x)), f"x ({down_type.name})")
    assert_within(got["inj"], want_inj[0], inj_rtol * 2, f"inj ({inject_type.name})")


@pytest.mark.gpu
@pytest.mark.parametrize(("hc", "n", "rank"), [(1, 64, 32), (2, 96, 64), (8, 64, 32), (32, 32, 32)])
def test_hc_read_fused_other_shapes(rng, hc, n, rank):
    """Stream counts that split a warp's lanes otherwise and streams shorter than a warp's share of blocks."""
    w, h = hc_weights(T.Q8_0, T.Q8_0, rng, hc=hc, n=n, rank=rank), random_streams(rng, hc, n)
    got = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True, q8=True)
    assert_fused_stages(got, w, h)


@pytest.mark.gpu
@pytest.mark.parametrize("up_type", [T.Q8_0, T.F32])
def test_hc_read_fused_without_q8_writes_the_same_x(rng, up_type):
    """Readers of x that take its floats ask for no q8_32 form (session/products/projection.hpp, q8_for): x's bits stay."""
    w, h = hc_weights(T.Q8_0, up_type, rng), random_streams(rng)
    floats = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True)
    with_q8 = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True, q8=True)
    assert "q8" not in floats and np.all(np.isfinite(floats["x"])), "non-finite x"
    for part in ("x", "inj", "low", "rms"):
        assert np.array_equal(floats[part].view(np.uint32), with_q8[part].view(np.uint32)), f"{part} changed"
    assert_fused_q8(with_q8)


@pytest.mark.gpu
def test_hc_read_fused_refuses_what_it_lacks(rng):
    w, h = hc_weights(T.F32, T.F32, rng, hc=3, n=64, rank=32), random_streams(rng, 3, 64)
    with pytest.raises(strata.InvalidArgument, match="the fused read takes no 3 x 64 streams of rank 32"):
        _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS, fused=True)
    wide = 2 * N  # float32 Hn of 4 x 5120 floats is 80 KB: more than a CTA's shared memory without an opt-in
    w, h = hc_weights(T.F32, T.F32, rng, n=wide), random_streams(rng, HC, wide)
    with pytest.raises(strata.InvalidArgument, match="43 KB of shared memory"):
        _native_check.hc_read(h, w["norm"], w["down"], w["up"], eps=EPS, fused=True)


ROWS = [1, 3, 67, 300]  # one token, a few, no multiple of a block or warp, a few hundred


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
def test_hc_mix_rows(rng, rows):
    up = (rng.standard_normal((rows, HC, N)) * 2).astype(np.float32)
    normed = (rng.standard_normal((rows, HC, N)) * rng.uniform(0.1, 10, (rows, HC, 1))).astype(np.float32)
    got = _native_check.hc_mix(up, normed)
    terms = sigmoid(up) * normed
    assert np.all(np.isfinite(got)), "non-finite block input"
    # In units of 2^-24 (a rounding): the sigmoid is within 6 of itself (expf's 2 ulp = 4, 1 + e and the
    # division 1 each), each of the HC fmas rounds a partial sum bounded by sum |terms|, and the division by HC
    # rounds once more: (HC + 7) of sum |terms| / HC, first order; HC + 8 covers the rest.
    bound = (HC + 8) * 2.0**-24 * np.abs(terms).sum(axis=1) / HC
    err = np.abs(got - terms.mean(axis=1))
    assert np.all(err <= bound), f"max error {err.max():.2e} (bound there {bound.flat[err.argmax()]:.2e})"
    each = np.concatenate([_native_check.hc_mix(up[r:r + 1], normed[r:r + 1]) for r in range(rows)])
    assert_same_bits(got, each, "the rows' mix vs one row at a time")


def assert_written(got: np.ndarray, h: np.ndarray, inj: np.ndarray, y: np.ndarray) -> None:
    want = hc_write(h, inj, y)
    assert np.all(np.isfinite(got)), "non-finite streams"
    # One fused multiply-add vs float64 then float32: equal up to a double rounding (one ulp).
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(want))), f"max error {np.max(np.abs(got - want)):.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize(("streams", "n"), [(4, 2560), (2, 100), (1, 33)])
def test_hc_write(rng, streams, n):
    h = (rng.standard_normal((1, streams, n)) * 3).astype(np.float32)
    inj = rng.uniform(0.0, 2.0, streams).astype(np.float32)
    y = rng.standard_normal((1, n)).astype(np.float32)
    assert_written(_native_check.hc_write(h, inj, y), h, inj[None], y)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("per_row", [True, False], ids=["inj-per-row", "inj-shared"])
def test_hc_write_rows(rng, rows, per_row):
    h = (rng.standard_normal((rows, HC, N)) * 3).astype(np.float32)
    inj = rng.uniform(0.0, 2.0, (rows, HC) if per_row else HC).astype(np.float32)
    y = rng.standard_normal((rows, N)).astype(np.float32)
    got = _native_check.hc_write(h, inj, y)
    assert_written(got, h, inj if per_row else np.broadcast_to(inj, (rows, HC)), y)
    each = np.concatenate([_native_check.hc_write(h[r:r + 1], inj[r:r + 1] if per_row else inj, y[r:r + 1])
                           for r in range(rows)])
    assert_same_bits(got, each, "the rows' write-back vs one row at a time")


def steered_want(written: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """The write, then each row's vector (broadcast over the streams) in float32: a zero adds nothing."""
    added = (written + vectors[:, None, :]).astype(np.float32)
    return np.where(vectors[:, None, :] != 0, added, written)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("streams", [HC, 1])
def test_a_steered_write_is_the_write_then_the_vector(rng, rows, streams):
    """(h + inj * y) + v, in that order, every stream alike: the plain write's bits, then one float32 addition."""
    h = (rng.standard_normal((rows, streams, N)) * 3).astype(np.float32)
    inj = rng.uniform(0.0, 2.0, (rows, streams)).astype(np.float32)
    y = rng.standard_normal((rows, N)).astype(np.float32)
    v = rng.standard_normal(N).astype(np.float32)
    v[::7] = 0.0  # zeros add nothing
    written = _native_check.hc_write(h, inj, y)
    got = _native_check.hc_write_steered(h, inj, y, v)
    assert_same_bits(got, steered_want(written, np.broadcast_to(v, (rows, N))), "one vector for every row")


@pytest.mark.gpu
def test_a_zero_vector_leaves_the_plain_writes_bits(rng):
    h = (rng.standard_normal((3, HC, N)) * 3).astype(np.float32)
    h[0, 0, :5] = -0.0  # -0 + 0 * -1 is -0, and stays so: a zero addend is skipped, not added (-0 + 0 is +0)
    inj = np.zeros((3, HC), np.float32)
    y = rng.standard_normal((3, N)).astype(np.float32)
    y[0, :5] = -1.0
    got = _native_check.hc_write_steered(h, inj, y, np.zeros(N, np.float32))
    assert_same_bits(got, _native_check.hc_write(h, inj, y), "a zero vector")
    assert np.all(np.signbit(got[0, 0, :5]))


@pytest.mark.gpu
def test_each_row_adds_its_own_vector_through_the_table(rng):
    """A step's rows: each row's vector through the pointer table at the layer's offset, none where its entry is
    null."""
    rows = 6
    h = (rng.standard_normal((rows, HC, N)) * 3).astype(np.float32)
    inj = rng.uniform(0.0, 2.0, (rows, HC)).astype(np.float32)
    y = rng.standard_normal((rows, N)).astype(np.float32)
    vectors = rng.standard_normal((rows, N)).astype(np.float32)
    has = np.array([1, 0, 1, 1, 0, 1], np.uint8)
    written = _native_check.hc_write(h, inj, y)
    got = _native_check.hc_write_steered(h, inj, y, vectors, has)
    assert_same_bits(got, steered_want(written, vectors * has[:, None]), "each row's vector")
    each = np.concatenate([_native_check.hc_write_steered(h[r:r + 1], inj[r:r + 1], y[r:r + 1], vectors[r])
                           if has[r] else written[r:r + 1] for r in range(rows)])
    assert_same_bits(got, each, "the rows' table vs one row at a time")


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [HC, 1])
def test_the_stream_mean_is_the_float64_mean(rng, streams):
    h = (rng.standard_normal((streams, N)) * 3).astype(np.float32)
    want = h.astype(np.float64).mean(axis=0).astype(np.float32)
    assert_same_bits(_native_check.hc_stream_mean(h), want, "the streams' mean")


def test_steered_write_shapes_must_match_without_a_device(rng):
    h = rng.standard_normal((3, HC, 64)).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match=r"\(vectors\): expected .* of shape \(64,\); found \(63,\)"):
        _native_check.hc_write_steered(h, np.ones(HC, np.float32), h[:, 0], np.ones(63, np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"\(vectors\): expected .* of shape \(3, 64\); found \(2, 64\)"):
        _native_check.hc_write_steered(h, np.ones(HC, np.float32), h[:, 0], np.ones((2, 64), np.float32))
    with pytest.raises(strata.InvalidArgument, match=r"\(row_has\): expected 3 flags"):
        _native_check.hc_write_steered(h, np.ones(HC, np.float32), h[:, 0], np.ones((3, 64), np.float32), [1, 0])


def test_hc_rows_shapes_must_match_without_a_device(rng):
    h = rng.standard_normal((3, HC, 64)).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match=r"\(inj\): expected .* of shape \(3, 4\); found \(2, 4\)"):
        _native_check.hc_write(h, np.ones((2, HC), np.float32), h[:, 0])
    with pytest.raises(strata.InvalidArgument, match=r"\(inj\): expected .* of shape \(4,\); found \(3,\)"):
        _native_check.hc_write(h, np.ones(3, np.float32), h[:, 0])
    with pytest.raises(strata.InvalidArgument, match=r"\(y\): expected .* of shape \(3, 64\); found \(3, 63\)"):
        _native_check.hc_write(h, np.ones(HC, np.float32), h[:, 0, :63])
    with pytest.raises(strata.InvalidArgument, match=r"\(normed\): expected .* of shape \(3, 4, 64\)"):
        _native_check.hc_mix(h, h[:2])


def test_hc_read_rejects_mismatched_weights_without_a_device(rng):
    w, h = hc_weights(T.F32, T.F32, rng), random_streams(rng)
    with pytest.raises(strata.InvalidArgument, match=r"up weight up is 320 x 10240, expected 10240 x 320"):
        _native_check.hc_read(h, w["norm"], w["down"], w["down"], eps=EPS)
    with pytest.raises(strata.InvalidArgument, match=r"inject weight inject is 320 x 10240, expected 4 x 10240"):
        _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["down"], eps=EPS)
    with pytest.raises(strata.InvalidArgument, match="of 10240 entries; found 2560"):
        _native_check.hc_read(h, w["norm"][:N], w["down"], w["up"], eps=EPS)
    with pytest.raises(strata.InvalidArgument, match=r"up weight up is 320 x 10240, expected 10240 x 320"):
        _native_check.hc_read(h, w["norm"], w["down"], w["down"], eps=EPS, fused=True)
    with pytest.raises(strata.InvalidArgument, match="from the fused read only"):
        _native_check.hc_read(h, w["norm"], w["down"], w["up"], eps=EPS, q8=True)
