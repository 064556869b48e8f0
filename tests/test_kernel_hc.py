"""The hyper-connection mixer on the GPU (docs/models/qwen4exp.md §3(a)): the read chained from the
grouped RMSNorm, q8_32, GEMV and hc kernels, stage by stage and whole against strata.reference.hc.hc_read with
activation_quant weights; the mix alone and the write-back against hc_write, over rows of tokens in one launch
(each row the same bits as a launch for that token alone, the decode step's rows = 1)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

import strata
from strata import _native_check
from strata.quant import dequantize, matvec, repack
from strata.reference.hc import hc_read, hc_write
from strata.reference.ops import grouped_rms_norm, sigmoid, silu
from strata.reference.weights import Weights

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


def hc_weights(down_type: T, up_type: T, rng: np.random.Generator) -> dict:
    # Gains put W_down Hn / 4, W_up lo and W_inj Hn / 4 near 1, where silu and sigmoid are far from flat.
    return {"down": weight(down_type, RANK, HC * N, 4.0, rng), "up": weight(up_type, HC * N, RANK, 2.0, rng),
            "inject": weight(down_type, HC, HC * N, 4.0, rng),
            "norm": (1.0 + 0.1 * rng.standard_normal(HC * N)).astype(np.float32)}


def random_streams(rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((HC, N)) * rng.uniform(0.1, 10, (HC, 1))).astype(np.float32)


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
def test_hc_read_without_inject_is_the_final_mixer(rng):
    w, h = hc_weights(T.Q8_0, T.Q8_0, rng), random_streams(rng)
    with_inject = _native_check.hc_read(h, w["norm"], w["down"], w["up"], w["inject"], eps=EPS)
    final = _native_check.hc_read(h, w["norm"], w["down"], w["up"], eps=EPS)
    assert "inj" not in final
    assert np.array_equal(final["x"], with_inject["x"]), "the inject GEMV must not change x"


ROWS = [1, 3, 67, 300]  # one token, a few, no multiple of a block or warp, a few hundred


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        f"{what}: {np.count_nonzero(got.view(np.uint32) != want.view(np.uint32))} elements differ")


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
