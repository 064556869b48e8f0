"""The MoE block's GPU kernels (router, shared-expert gate, SwiGLU, combine, the VRAM-cached experts' slots and
sum) vs strata.reference.moe.route and float64 numpy formulas (docs/models/qwen3next.md §3.3)."""

import numpy as np
import pytest

import strata
from strata import _native_check
from strata.reference.moe import route
from strata.reference.ops import sigmoid, silu

# Router weights: float32 exp(z - max) of a float32 difference (one rounding of up to |z - max| ~ 30, so a
# relative error of ~30 * 6e-8 in the exp) and a float32 sum of <= 16 terms: 1e-5 relative is ample.
ROUTE_RTOL = 1e-5


def check_route(logits: np.ndarray, k: int, note: str) -> None:
    ids, weights = _native_check.moe_route(logits, k)
    want_ids, want_weights = route(logits, k)
    assert np.all(np.isfinite(weights)), f"non-finite router weights ({note})"
    assert np.array_equal(ids, want_ids), f"ids {ids[:2]} vs reference {want_ids[:2]} ({note})"
    err = float(np.max(np.abs(weights.astype(np.float64) - want_weights) / want_weights))
    assert err < ROUTE_RTOL, f"max relative weight error {err:.2e} ({note})"
    assert np.allclose(weights.sum(axis=1), 1.0, atol=1e-6), f"weights do not sum to 1 ({note})"


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "n_expert", "k"), [(1, 512, 10), (3, 512, 10), (2, 256, 8), (1, 64, 16),
                                                       (4, 1024, 1), (1, 33, 33 // 3)])
def test_route_random_logits(rng, tokens, n_expert, k):
    logits = (rng.standard_normal((tokens, n_expert)) * rng.uniform(0.5, 6)).astype(np.float32)
    check_route(logits, k, f"{tokens}x{n_expert} top-{k}")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 10, 16])
def test_route_exact_ties_go_to_the_lower_index(rng, k):
    few_values = rng.integers(-3, 3, size=(5, 512)).astype(np.float32) * np.float32(0.75)  # ~85 copies of each
    constant = np.full((1, 512), rng.standard_normal(), np.float32)
    logits = np.concatenate([few_values, constant])
    check_route(logits, k, f"ties, top-{k}")
    ids, weights = _native_check.moe_route(constant, k)
    assert np.array_equal(ids[0], np.arange(k)), f"a constant row must pick experts 0..{k - 1}, got {ids[0]}"
    assert np.allclose(weights, 1.0 / k, rtol=1e-6), f"a constant row must weigh 1/k each, got {weights}"


def test_route_rejects_bad_sizes_without_a_device(rng):
    logits = rng.standard_normal((1, 512)).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="k=17"):
        _native_check.moe_route(logits, 17)
    with pytest.raises(strata.InvalidArgument, match="k=0"):
        _native_check.moe_route(logits, 0)
    with pytest.raises(strata.InvalidArgument, match="n_expert <= 1024, got 1 x 2048"):
        _native_check.moe_route(rng.standard_normal((1, 2048)).astype(np.float32), 8)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2560, 2048, 100])
def test_shared_expert_gate(rng, n):
    w = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal(n) * 2 / np.sqrt(n)).astype(np.float32)  # w . x ~ N(0, 4): the sigmoid is not flat
    got = _native_check.shared_expert_gate(w, x)
    wx = w.astype(np.float64) * x
    want = float(sigmoid(wx.sum()))
    # A float32 sum of n products (a strided per-thread sum, then a 256-way tree) is within ~18 roundings of
    # sum |w x|; the sigmoid's slope is at most 1/4, and the gate itself rounds once more.
    bound = 0.25 * 18 * 6e-8 * float(np.abs(wx).sum()) + 1.2e-7
    assert np.isfinite(got) and abs(got - want) <= bound, f"gate {got} vs {want} (bound {bound:.1e})"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [640, 512, 37])
def test_swiglu(rng, n):
    g = (rng.standard_normal(n) * 3).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    got = _native_check.swiglu(g, u)
    want = silu(g) * u
    assert np.all(np.isfinite(got)), "non-finite SwiGLU output"
    # expf (2 ulp), 1 + e, a division and two products: within 8 float32 roundings of each element.
    err = float(np.max(np.abs(got - want) / np.abs(want)))
    assert err < 8 * 6e-8, f"max relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2560, 2048, 31])
def test_moe_combine(rng, n):
    routed = rng.standard_normal(n).astype(np.float32)
    shared = (rng.standard_normal(n) * 4).astype(np.float32)
    gate = float(np.float32(rng.uniform(0.05, 0.95)))
    got = _native_check.moe_combine(routed, shared, gate)
    want = routed.astype(np.float64) + gate * shared.astype(np.float64)
    assert np.all(np.isfinite(got)), "non-finite combine output"
    # One fused multiply-add: the float32 rounding of the exact value (float64 may round once more first).
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(got))), f"max error {np.max(np.abs(got - want)):.2e}"


def test_moe_vectors_must_match_without_a_device(rng):
    a = rng.standard_normal(64).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="of 64 entries; found 63"):
        _native_check.swiglu(a, a[:63])
    with pytest.raises(strata.InvalidArgument, match="of 64 entries; found 65"):
        _native_check.moe_combine(a, np.append(a, 1.0), 0.5)
    with pytest.raises(strata.InvalidArgument, match="of 64 entries; found 32"):
        _native_check.shared_expert_gate(a, a[:32])


# The routed experts held in VRAM: where each chosen expert sits in the layer's cache, and the cached experts'
# weighted sum of down rows (kernels/moe.cuh).
def random_cache(n_expert: int, n_cached: int, rng: np.random.Generator) -> np.ndarray:
    """slot_of [n_expert]: n_cached experts at distinct slots in random order, -1 for the others."""
    slot_of = np.full(n_expert, -1, np.int32)
    slot_of[rng.choice(n_expert, n_cached, replace=False)] = rng.permutation(n_cached)
    return slot_of


@pytest.mark.gpu
@pytest.mark.parametrize(("n_expert", "n_cached", "k"), [(512, 64, 10), (512, 500, 10), (64, 1, 8), (256, 128, 1)])
def test_expert_slots(rng, n_expert, n_cached, k):
    slot_of = random_cache(n_expert, n_cached, rng)
    ids = rng.choice(n_expert, k, replace=False).astype(np.int32)
    cached, missing = np.flatnonzero(slot_of >= 0), np.flatnonzero(slot_of < 0)
    if k > 1:  # a hit and a miss among the chosen, whatever the draw
        ids[:2] = rng.choice(cached), rng.choice(missing)
    got = _native_check.expert_slots(slot_of, ids)
    assert got.dtype == np.int32 and np.array_equal(got, slot_of[ids]), f"slots {got} vs {slot_of[ids]}"


def cached_sum_case(k: int, n: int, rng: np.random.Generator):
    """rows [k, n] with NaN in the rows of skipped products, slots with at least one skip and one hit, weights."""
    slots = rng.integers(-1, 64, size=k).astype(np.int32)
    slots[rng.permutation(k)[:2]] = [-1, rng.integers(64)]
    rows = (rng.standard_normal((k, n)) * rng.uniform(0.1, 10, size=(k, 1))).astype(np.float32)
    rows[slots < 0] = np.nan  # never written on the token path: nothing of them may leak into the sum
    weights = rng.dirichlet(np.ones(k)).astype(np.float32)
    return rows, slots, weights


def cached_sum_bound(rows: np.ndarray, slots: np.ndarray, weights: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Per element: k fmas from 0 and the final add each round once (2^-24 relative) on partial sums bounded by
    |out| + sum |w r|, so the error is at most (k + 1) 2^-24 of that, first order; (k + 2) covers the rest."""
    hit = slots >= 0
    size = np.abs(weights[hit, None].astype(np.float64) * rows[hit]).sum(axis=0)
    if out is not None:
        size += np.abs(out.astype(np.float64))
    return (len(slots) + 2) * 2.0**-24 * size


@pytest.mark.gpu
@pytest.mark.parametrize(("k", "n"), [(10, 2560), (8, 2048), (16, 37), (3, 1)])
def test_moe_cached_sum(rng, k, n):
    rows, slots, weights = cached_sum_case(k, n, rng)
    hit = slots >= 0
    want = (weights[hit, None].astype(np.float64) * rows[hit]).sum(axis=0)
    got = _native_check.moe_cached_sum(rows, slots, weights)
    assert np.all(np.isfinite(got)), "non-finite sum: a skipped row or the poisoned out leaked in"
    err = np.abs(got - want)
    bound = cached_sum_bound(rows, slots, weights, None)
    assert np.all(err <= bound), f"max error {err.max():.2e} (bound there {bound[err.argmax()]:.2e})"
    again = _native_check.moe_cached_sum(rows, slots, weights)
    assert np.array_equal(got.view(np.uint32), again.view(np.uint32)), "two runs gave different bits"

    out = rng.standard_normal(n).astype(np.float32)
    added = _native_check.moe_cached_sum(rows, slots, weights, out)
    assert np.all(np.isfinite(added)), "non-finite accumulated sum"
    err = np.abs(added - (out.astype(np.float64) + want))
    bound = cached_sum_bound(rows, slots, weights, out)
    assert np.all(err <= bound), f"accumulate: max error {err.max():.2e} (bound there {bound[err.argmax()]:.2e})"
    # out[i] + (the sum without accumulate): one float32 add of the same bits.
    assert np.array_equal(added.view(np.uint32), (out + got).view(np.uint32)), "accumulate is not out + the sum"


@pytest.mark.gpu
def test_moe_cached_sum_of_no_hits(rng):
    rows = np.full((10, 64), np.nan, np.float32)
    slots = np.full(10, -1, np.int32)
    weights = rng.dirichlet(np.ones(10)).astype(np.float32)
    assert np.array_equal(_native_check.moe_cached_sum(rows, slots, weights), np.zeros(64, np.float32))
    out = rng.standard_normal(64).astype(np.float32)
    assert np.array_equal(_native_check.moe_cached_sum(rows, slots, weights, out), out)


def test_expert_slots_refuses_an_id_outside_the_experts_without_a_device(rng):
    slot_of = random_cache(64, 8, rng)
    with pytest.raises(strata.InvalidArgument, match=r"expert_slots: ids\[1\] = 64 is not an expert of 64"):
        _native_check.expert_slots(slot_of, [3, 64])
    with pytest.raises(strata.InvalidArgument, match=r"expert_slots: ids\[0\] = -1 is not an expert of 64"):
        _native_check.expert_slots(slot_of, [-1])


def test_moe_cached_sum_shapes_must_match_without_a_device(rng):
    rows, slots, weights = cached_sum_case(4, 32, rng)
    with pytest.raises(strata.InvalidArgument, match=r"slots\): expected a non-empty int32 vector of 4 entries"):
        _native_check.moe_cached_sum(rows, slots[:3], weights)
    with pytest.raises(strata.InvalidArgument, match=r"weights\): expected a non-empty float32 vector of 4 entries"):
        _native_check.moe_cached_sum(rows, slots, weights[:2])
    with pytest.raises(strata.InvalidArgument, match=r"out\): expected a non-empty float32 vector of 32 entries"):
        _native_check.moe_cached_sum(rows, slots, weights, np.zeros(31, np.float32))
