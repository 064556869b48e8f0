"""The MoE block's GPU kernels (router, shared-expert gate, SwiGLU, combine) vs strata.reference.moe.route and
float64 numpy formulas (docs/models/qwen3next.md §3.3)."""

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
