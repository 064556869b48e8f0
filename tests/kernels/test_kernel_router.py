"""The decode step's fused router (cuda/src/kernels/router_publish.cuh: the router GEMV over many CTAs, then in
the last CTA the top k, the VRAM cache's slots and the doorbell's publish) against the numpy router
(strata.reference.moe.route on strata.quant.matvec's logits) and against the unfused kernels it replaces (gemv,
moe_route), bit for bit. Every check runs two replays of one captured graph (x, then -x: two different routes),
every output and the mapped doorbell poisoned before each replay, and the CTAs' ticket must be zero after.

The routers are built so that no seed can meet a near-tie: their rows are picked from a larger pool by the
reference logits, the k largest and the k smallest each MARGIN apart from one another and from every other row.
The GPU's logits differ from the reference's by float32 summation order only (test_kernel_gemv.py's bounds,
~1e-5 of the terms), far below MARGIN, so the ids must be the reference's exactly, for x and for -x.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from support.compare import assert_same_bits
from support.hooks import native_check as _native_check
from strata.quant import QuantTensor, dequantize, matvec
from strata.quant.forms import FORMS
from strata.reference.moe import route
from test_kernel_gemv import FLOAT_RTOL, QUANT_RTOL, _row_slice, error_of_terms, random_weight

pytestmark = pytest.mark.hooks

QUANT_TYPES = [t for t, f in FORMS.items() if not f.is_float]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
# A row's error budget relative to its sum_j |w_rj x_j| (the terms its logit's rounding scales with): 100 times
# the loosest GEMV bound, which is relative to the largest row's terms.
MARGIN = 1e-3
# Router weights (test_kernel_moe.py's ROUTE_RTOL for the same logits), plus the logits' own error: a logit
# moved by d moves exp(z - max) by at most e^(2d) and the sum of the top k by as much, so 4 d relative.
ROUTE_RTOL = 1e-5
RING_BASE = 5000
# (n_expert, n, k): qwen4exp, qwen3next-like, the most experts the router takes (two warps per row), the
# largest k, and counts that fill no CTA.
SHAPES = [(512, 2560, 10), (256, 2048, 8), (1024, 256, 4), (64, 512, 16), (33, 256, 11)]


def reference_logits(w, x: np.ndarray) -> np.ndarray:
    """The router's logits as the GPU computes them, in numpy: quantized forms under the q8_32 contract."""
    if isinstance(w, QuantTensor):
        return matvec(w, x).astype(np.float64)
    return dequantize(w).astype(np.float64) @ x.astype(np.float64)


def spaced(z: np.ndarray, budget: np.ndarray, order: np.ndarray, k: int) -> list[int]:
    """The first k of `order`, each apart from the one picked before it (their logits differ by more than the sum
    of their error budgets)."""
    picked: list[int] = []
    for i in order:
        if not picked or abs(z[picked[-1]] - z[i]) >= budget[picked[-1]] + budget[i]:
            picked.append(int(i))
            if len(picked) == k:
                break
    return picked


def router_case(ggml_type: T, n_expert: int, n: int, k: int, rng: np.random.Generator):
    """(router, x [2, n], reference logits [2, n_expert]) with the top k and bottom k of x's logits apart.

    Row r's logit may err by MARGIN * sum_j |w_rj x_j| (its budget; the GEMV's error is 100 times smaller); two
    rows are apart when their logits differ by more than their budgets together. The rows come from a pool of
    3 n_expert random ones (rows quantize independently, so a row keeps its values when picked); x is scaled
    so that the logits' spread is ~2 (the softmax weights stay far from float32's underflow).
    """
    pool = random_weight(ggml_type, 3 * n_expert, n, rng)
    w = dequantize(pool).astype(np.float64)
    x = rng.standard_normal(n).astype(np.float32)
    x = (x * np.float32(2.0 / max(np.std(w @ x.astype(np.float64)), 1e-30))).astype(np.float32)
    z = reference_logits(pool, x)
    budget = MARGIN * (np.abs(w) @ np.abs(x).astype(np.float64))
    order = np.argsort(-z, kind="stable")
    top, bottom = spaced(z, budget, order, k), spaced(z, budget, order[::-1], k)
    inner = [int(i) for i in order if z[top[-1]] - z[i] >= budget[top[-1]] + budget[i]
             and z[i] - z[bottom[-1]] >= budget[bottom[-1]] + budget[i]]
    rows = np.array(top + bottom + inner[: n_expert - 2 * k])
    # Only a pool whose logits crowd within a few budgets of the extremes could fall short.
    assert rows.size == n_expert and np.unique(rows).size == n_expert, "the pool left too few rows apart"
    rows = rng.permutation(rows)
    router = _row_slice(pool, rows) if isinstance(pool, QuantTensor) else pool[rows]
    xs = np.stack([x, -x])  # q8_32 and every product are odd in x: exactly the negated logits, another route
    return router, xs, np.stack([reference_logits(router, xs[0]), reference_logits(router, xs[1])])


def random_cache(n_expert: int, n_cached: int, rng: np.random.Generator) -> np.ndarray:
    """slot_of [n_expert]: n_cached experts at distinct slots in random order, -1 for the others."""
    slot_of = np.full(n_expert, -1, np.int32)
    slot_of[rng.choice(n_expert, n_cached, replace=False)] = rng.permutation(n_cached)
    return slot_of


def check_router(ggml_type: T, n_expert: int, n: int, k: int, rng: np.random.Generator, ring: bool = True):
    router, xs, want_logits = router_case(ggml_type, n_expert, n, k, rng)
    slot_of = random_cache(n_expert, n_expert // 2, rng)
    got = _native_check.route_publish(router, xs, k, slot_of, ring=ring, ring_base=RING_BASE)
    rtol = QUANT_RTOL if isinstance(router, QuantTensor) else FLOAT_RTOL
    note = f"{ggml_type.name} {n_expert}x{n} top-{k}"
    for r in range(2):
        logits, ids, weights = got["logits"][r], got["ids"][r], got["weights"][r]
        assert np.all(np.isfinite(logits)) and np.all(np.isfinite(weights)), f"non-finite outputs ({note}, {r})"
        # The same bits as the unfused path: the GEMV, then moe_route on its logits.
        assert_same_bits(logits, _native_check.gemv(router, xs[r]), f"logits vs gemv ({note}, replay {r})")
        unfused_ids, unfused_weights = _native_check.moe_route(logits[None], k)
        assert np.array_equal(ids, unfused_ids[0]), f"ids {ids} vs moe_route {unfused_ids[0]} ({note}, {r})"
        assert_same_bits(weights, unfused_weights[0], f"weights vs moe_route ({note}, replay {r})")
        # The numpy router: the same ids, the weights within the logits' error.
        err = error_of_terms(logits, want_logits[r], router, xs[r])
        assert err < rtol, f"logits: max error {err:.2e} of max sum |w x| ({note}, replay {r})"
        want_ids, want_weights = route(want_logits[r][None], k)
        assert np.array_equal(ids, want_ids[0]), f"ids {ids} vs reference {want_ids[0]} ({note}, replay {r})"
        drift = float(np.max(np.abs(logits.astype(np.float64) - want_logits[r])))
        weight_err = float(np.max(np.abs(weights.astype(np.float64) - want_weights[0]) / want_weights[0]))
        assert weight_err < ROUTE_RTOL + 4 * drift, f"weights: relative error {weight_err:.2e} ({note}, {r})"
        assert np.array_equal(got["slots"][r], slot_of[ids]), f"slots ({note}, replay {r})"
        if ring:
            assert_same_bits(got["bell_x"][r], xs[r], f"doorbell x ({note}, replay {r})")
            assert np.array_equal(got["bell_ids"][r], ids), f"doorbell ids ({note}, replay {r})"
            assert_same_bits(got["bell_weights"][r], weights, f"doorbell weights ({note}, replay {r})")
            assert got["seq"][r, 0] == RING_BASE + r + 1, f"ring {got['seq'][r, 0]} ({note}, replay {r})"
        else:  # nothing reached the doorbell: still the poison of 0xFF bytes
            assert np.all(np.isnan(got["bell_x"][r])) and np.all(np.isnan(got["bell_weights"][r])), note
            assert np.all(got["bell_ids"][r] == -1) and got["seq"][r, 0] == -1, note
    assert not np.array_equal(got["ids"][0], got["ids"][1]), f"x and -x routed alike ({note})"
    assert got["ticket"][0] == 0, f"the ticket was left at {got['ticket'][0]} ({note})"


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", FLOAT_TYPES + [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize(("n_expert", "n", "k"), SHAPES)
def test_route_publish_shapes(rng, ggml_type, n_expert, n, k):
    check_router(ggml_type, n_expert, n, k, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
def test_route_publish_every_quantized_form(rng, ggml_type):
    check_router(ggml_type, 512, 2560, 10, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0], ids=lambda t: t.name)
def test_route_publish_without_the_ring_leaves_the_doorbell_alone(rng, ggml_type):
    """A layer whose experts the cache holds whole: the route and the slots, no publish."""
    check_router(ggml_type, 512, 2560, 10, rng, ring=False)


def test_route_publish_rejects_bad_shapes_without_a_device(rng):
    router = rng.standard_normal((512, 256)).astype(np.float32)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="k=17"):
        _native_check.route_publish(router, x, 17)
    with pytest.raises(strata.InvalidArgument, match="k=0"):
        _native_check.route_publish(router, x, 0)
    with pytest.raises(strata.InvalidArgument, match="x has 100 columns, the router has 256"):
        _native_check.route_publish(router, x[:, :100], 8)
    with pytest.raises(strata.InvalidArgument, match="2048 x 256, expected 1 to 1024 experts"):
        _native_check.route_publish(np.zeros((2048, 256), np.float32), x, 8)
    with pytest.raises(strata.InvalidArgument, match="slot_of"):
        _native_check.route_publish(router, x, 8, slot_of=np.zeros(3, np.int32))
