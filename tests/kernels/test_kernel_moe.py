"""The MoE block's GPU kernels (router, shared-expert gate, SwiGLU, combine, the VRAM-cached experts' sum, a
prompt chunk's row gather and per-token sum of expert-grouped rows) vs strata.reference.moe.route and
float64 numpy formulas (docs/models/qwen3next.md §3.3). The per-token kernels run over rows of tokens in one
launch; each row must be the same bits as a launch for that token alone (the decode step's rows = 1)."""

import numpy as np
import pytest

import strata
from support.compare import assert_same_bits
from support.q8_form import assert_q8_of
from support.hooks import native_check as _native_check
from strata.reference.moe import route
from strata.reference.ops import sigmoid, silu

pytestmark = pytest.mark.hooks

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


# Token counts for the rows kernels: one, a few, one that is no multiple of a block or warp, a few hundred.
ROWS = [1, 3, 67, 300]


def gate_bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The float32 dot (a strided sum of ceil(n / 256) fmas per thread, then 5 + 5 levels of the 256-thread tree)
    rounds once per level, each within 2^-24 of sum |w x|; the sigmoid's slope is at most 1/4, and the sigmoid
    itself (expf's 2 ulp, 1 + e, the division) is within 6 roundings of a gate below 1."""
    depth = -(-w.shape[-1] // 256) + 10
    return 0.25 * depth * 2.0**-24 * np.abs(w.astype(np.float64) * x).sum(axis=-1) + 6 * 2.0**-24


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2560, 2048, 100])
def test_shared_expert_gate(rng, n):
    w = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal(n) * 2 / np.sqrt(n)).astype(np.float32)  # w . x ~ N(0, 4): the sigmoid is not flat
    got = _native_check.shared_expert_gate(w, x[None])
    want = float(sigmoid((w.astype(np.float64) * x).sum()))
    bound = float(gate_bound(w, x))
    assert got.shape == (1,) and np.isfinite(got[0]) and abs(got[0] - want) <= bound, (
        f"gate {got} vs {want} (bound {bound:.1e})")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
def test_shared_expert_gate_rows(rng, rows):
    n = 2560
    w = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.5, 3, (rows, 1)) / np.sqrt(n)).astype(np.float32)
    got = _native_check.shared_expert_gate(w, x)
    want = sigmoid((w.astype(np.float64) * x).sum(axis=1))
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - want) <= gate_bound(w, x)), "gates vs float64"
    each = np.concatenate([_native_check.shared_expert_gate(w, x[r:r + 1]) for r in range(rows)])
    assert_same_bits(got, each, "gates of the rows vs one row at a time")


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
@pytest.mark.parametrize("n", [640, 512, 5120, 10 * 768])
def test_swiglu_writes_the_q8_form_of_its_output(rng, n):
    """The shared and the cached experts' SwiGLU write h's q8_32 form for a quantized down: the same output bits
    as without it, the form quantize_q8_32 of that output."""
    g = (rng.standard_normal(n) * 3).astype(np.float32)
    u = (rng.standard_normal(n) * np.exp2(rng.uniform(-8, 8, n))).astype(np.float32)
    got, q8 = _native_check.swiglu(g, u, q8=True)
    assert np.array_equal(got.view(np.uint32), _native_check.swiglu(g, u).view(np.uint32))
    assert_q8_of(got, q8, f"swiglu n={n}")


def test_swiglu_q8_form_needs_whole_blocks(rng):
    a = rng.standard_normal(48).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="swiglu: a q8_32 output needs n a multiple of 32, got 48"):
        _native_check.swiglu(a, a, q8=True)


def combine_case(rows: int, n: int, rng: np.random.Generator):
    routed = rng.standard_normal((rows, n)).astype(np.float32)
    shared = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    gate = rng.uniform(0.05, 0.95, rows).astype(np.float32)
    return routed, shared, gate


def assert_combined(got, routed, shared, gate) -> None:
    want = routed.astype(np.float64) + gate[:, None].astype(np.float64) * shared.astype(np.float64)
    assert np.all(np.isfinite(got)), "non-finite combine output"
    # One fused multiply-add: the float32 rounding of the exact value (float64 may round once more first).
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(got))), f"max error {np.max(np.abs(got - want)):.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2560, 2048, 31])
def test_moe_combine(rng, n):
    routed, shared, gate = combine_case(1, n, rng)
    assert_combined(_native_check.moe_combine(routed, shared, gate), routed, shared, gate)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
def test_moe_combine_rows(rng, rows):
    routed, shared, gate = combine_case(rows, 2560, rng)
    got = _native_check.moe_combine(routed, shared, gate)
    assert_combined(got, routed, shared, gate)
    each = np.concatenate([_native_check.moe_combine(routed[r:r + 1], shared[r:r + 1], gate[r:r + 1])
                           for r in range(rows)])
    assert_same_bits(got, each, "combine of the rows vs one row at a time")


def test_moe_vectors_must_match_without_a_device(rng):
    a = rng.standard_normal(64).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match="of 64 entries; found 63"):
        _native_check.swiglu(a, a[:63])
    with pytest.raises(strata.InvalidArgument,
                       match=r"\(shared\): expected a non-empty float32 array of shape \(1, 64\)"):
        _native_check.moe_combine(a[None], np.append(a, 1.0)[None], [0.5])
    with pytest.raises(strata.InvalidArgument, match=r"gate\): expected a non-empty float32 array of shape \(1,\)"):
        _native_check.moe_combine(a[None], a[None], [0.5, 0.5])
    with pytest.raises(strata.InvalidArgument, match=r"x\): expected a non-empty float32 array of shape \(any, 64\)"):
        _native_check.shared_expert_gate(a, a[None, :32])


# The routed experts held in VRAM: the cached experts' weighted sum of down rows (kernels/moe.cuh; their slots
# come with the router, tests/kernels/test_kernel_router.py).
def cached_sum_case(tokens: int, k: int, n: int, rng: np.random.Generator):
    """rows [tokens, k, n] with NaN in the rows of skipped products, slots [tokens, k] with at least one skip and
    one hit per token, weights [tokens, k]."""
    slots = rng.integers(-1, 64, size=(tokens, k)).astype(np.int32)
    for t in range(tokens):
        slots[t, rng.permutation(k)[:2]] = [-1, rng.integers(64)]
    rows = (rng.standard_normal((tokens, k, n)) * rng.uniform(0.1, 10, size=(tokens, k, 1))).astype(np.float32)
    rows[slots < 0] = np.nan  # never written on the token path: nothing of them may leak into the sum
    weights = rng.dirichlet(np.ones(k), size=tokens).astype(np.float32)
    return rows, slots, weights


def weighted_terms(rows: np.ndarray, slots: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The float64 products weights[t, j] * rows[t, j] [tokens, k, n], 0 where slots[t, j] < 0."""
    hit = (slots >= 0)[:, :, None]
    return np.where(hit, weights[:, :, None].astype(np.float64) * np.where(hit, rows, 0), 0.0)


def cached_sum_bound(terms: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Per element: k fmas from 0 and the final add each round once (2^-24 relative) on partial sums bounded by
    |out| + sum |w r|, so the error is at most (k + 1) 2^-24 of that, first order; (k + 2) covers the rest."""
    size = np.abs(terms).sum(axis=1)
    if out is not None:
        size += np.abs(out.astype(np.float64))
    return (terms.shape[1] + 2) * 2.0**-24 * size


def check_cached_sum(rows: np.ndarray, slots: np.ndarray, weights: np.ndarray, rng: np.random.Generator):
    """The sum and the accumulate against float64, and the same bits on a second run; returns both results."""
    terms = weighted_terms(rows, slots, weights)
    want = terms.sum(axis=1)
    got = _native_check.moe_cached_sum(rows, slots, weights)
    assert np.all(np.isfinite(got)), "non-finite sum: a skipped row or the poisoned out leaked in"
    err = np.abs(got - want)
    bound = cached_sum_bound(terms, None)
    assert np.all(err <= bound), f"max error {err.max():.2e} (bound there {bound.flat[err.argmax()]:.2e})"
    assert_same_bits(_native_check.moe_cached_sum(rows, slots, weights), got, "two runs")

    out = rng.standard_normal(want.shape).astype(np.float32)
    added = _native_check.moe_cached_sum(rows, slots, weights, out)
    assert np.all(np.isfinite(added)), "non-finite accumulated sum"
    err = np.abs(added - (out.astype(np.float64) + want))
    bound = cached_sum_bound(terms, out)
    assert np.all(err <= bound), f"accumulate: max error {err.max():.2e} (bound there {bound.flat[err.argmax()]:.2e})"
    # out[i] + (the sum without accumulate): one float32 add of the same bits.
    assert_same_bits(added, out + got, "accumulate vs out + the sum")
    return got, added, out


@pytest.mark.gpu
@pytest.mark.parametrize(("k", "n"), [(10, 2560), (8, 2048), (16, 37), (3, 1)])
def test_moe_cached_sum(rng, k, n):
    check_cached_sum(*cached_sum_case(1, k, n, rng), rng)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", ROWS)
def test_moe_cached_sum_tokens(rng, tokens):
    rows, slots, weights = cached_sum_case(tokens, 10, 2560, rng)
    got, added, out = check_cached_sum(rows, slots, weights, rng)
    one = [slice(t, t + 1) for t in range(tokens)]
    each = np.concatenate([_native_check.moe_cached_sum(rows[t], slots[t], weights[t]) for t in one])
    assert_same_bits(got, each, "the tokens' sums vs one token at a time")
    each = np.concatenate([_native_check.moe_cached_sum(rows[t], slots[t], weights[t], out[t]) for t in one])
    assert_same_bits(added, each, "the tokens' accumulated sums vs one token at a time")


@pytest.mark.gpu
def test_moe_cached_sum_of_no_hits(rng):
    rows = np.full((2, 10, 64), np.nan, np.float32)
    slots = np.full((2, 10), -1, np.int32)
    weights = rng.dirichlet(np.ones(10), size=2).astype(np.float32)
    assert np.array_equal(_native_check.moe_cached_sum(rows, slots, weights), np.zeros((2, 64), np.float32))
    out = rng.standard_normal((2, 64)).astype(np.float32)
    assert np.array_equal(_native_check.moe_cached_sum(rows, slots, weights, out), out)


# A prompt chunk's routed experts: each computed once for all the tokens that chose it, on input rows gathered
# per expert, its output rows grouped by expert; moe_weighted_rows puts them back per token.
def grouped_case(tokens: int, k: int, n: int, rng: np.random.Generator):
    """Routed rows grouped by expert as a chunk holds them: (rows [m, n], row_of [tokens, k], weights [tokens, k],
    ids [tokens, k]). About a quarter of the choices are left to the host (row_of -1), at least one per token
    when k > 1, and rows past the grouped ones are NaN padding that must never be read."""
    ids = np.stack([rng.choice(64, k, replace=False) for _ in range(tokens)]).astype(np.int32)
    on_device = rng.random((tokens, k)) >= 0.25
    if k > 1:
        on_device[np.arange(tokens), rng.integers(k, size=tokens)] = False
        on_device[0, :] = True  # and one token wholly on the device
    order = np.lexsort((np.arange(tokens * k), ids.reshape(-1)))  # by expert, then token: the chunk's grouping
    order = order[on_device.reshape(-1)[order]]
    row_of = np.full(tokens * k, -1, np.int32)
    row_of[order] = np.arange(len(order))
    rows = (rng.standard_normal((len(order) + 5, n)) * rng.uniform(0.1, 10, (len(order) + 5, 1))).astype(np.float32)
    rows[len(order):] = np.nan
    weights = rng.dirichlet(np.ones(k), size=tokens).astype(np.float32)
    return rows, row_of.reshape(tokens, k), weights, ids


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "k", "n"), [(1, 10, 2560), (3, 10, 2560), (67, 8, 2048), (300, 10, 2560),
                                                (5, 1, 37)])
def test_moe_weighted_rows(rng, tokens, k, n):
    rows, row_of, weights, _ = grouped_case(tokens, k, n, rng)
    got = _native_check.moe_weighted_rows(rows, row_of, weights)
    per_token = rows[np.maximum(row_of, 0)]  # [tokens, k, n]; a skipped choice's row is ignored below
    terms = weighted_terms(per_token, row_of, weights)
    assert np.all(np.isfinite(got)), "non-finite sum: padding, a skipped row or the poisoned out leaked in"
    err = np.abs(got - terms.sum(axis=1))
    bound = cached_sum_bound(terms, None)
    assert np.all(err <= bound), f"max error {err.max():.2e} (bound there {bound.flat[err.argmax()]:.2e})"
    # The decode step's sum over the same rows in the token's own order: the same fmas in the same order.
    per_token[row_of < 0] = np.nan
    assert_same_bits(got, _native_check.moe_cached_sum(per_token, row_of, weights), "vs moe_cached_sum")


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n"), [(1, 2560), (3, 2048), (67, 37), (300, 2560)])
def test_gather_rows(rng, m, n):
    src = (rng.standard_normal((50, n)) * 3).astype(np.float32)
    index = rng.integers(0, 50, m).astype(np.int32)  # repeats and any order, as a token list per expert may not
    assert_same_bits(_native_check.gather_rows(src, index), src[index], "gathered rows")


@pytest.mark.gpu
def test_gather_then_weighted_rows_is_the_routed_sum(rng):
    """The chunk's round trip: each expert's tokens gathered, their rows "computed" (scaled per expert), and
    put back per token, against the per-token weighted sum of the same products."""
    tokens, k, n = 40, 8, 256
    _, row_of, weights, ids = grouped_case(tokens, k, n, rng)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    flat = row_of.reshape(-1)
    token_of = np.empty(flat.max() + 1, np.int32)
    token_of[flat[flat >= 0]] = np.flatnonzero(flat >= 0) // k
    gathered = _native_check.gather_rows(x, token_of)
    assert_same_bits(gathered, x[token_of], "gathered inputs")
    scale = rng.uniform(0.5, 2, 64).astype(np.float32)
    expert_of = np.empty_like(token_of)
    expert_of[flat[flat >= 0]] = ids.reshape(-1)[flat >= 0]
    products = gathered * scale[expert_of, None]
    got = _native_check.moe_weighted_rows(products, row_of, weights)
    per_token = x[:, None, :] * scale[ids][:, :, None]
    terms = weighted_terms(per_token, row_of, weights)
    err = np.abs(got - terms.sum(axis=1))
    assert np.all(err <= cached_sum_bound(terms, None)), f"max error {err.max():.2e}"


def test_moe_cached_sum_shapes_must_match_without_a_device(rng):
    rows, slots, weights = cached_sum_case(2, 4, 32, rng)
    with pytest.raises(strata.InvalidArgument, match=r"slots\): expected a non-empty int32 array of shape \(2, 4\)"):
        _native_check.moe_cached_sum(rows, slots[:, :3], weights)
    with pytest.raises(strata.InvalidArgument, match=r"weights\): expected .* of shape \(2, 4\); found \(1, 4\)"):
        _native_check.moe_cached_sum(rows, slots, weights[:1])
    with pytest.raises(strata.InvalidArgument, match=r"out\): expected .* of shape \(2, 32\); found \(2, 31\)"):
        _native_check.moe_cached_sum(rows, slots, weights, np.zeros((2, 31), np.float32))


def test_routed_rows_refuse_rows_outside_the_source_without_a_device(rng):
    rows, row_of, weights, _ = grouped_case(3, 4, 32, rng)
    row_of[2, 1] = len(rows)
    with pytest.raises(strata.InvalidArgument,
                       match=rf"moe_weighted_rows: row_of\[9\] = {len(rows)} is not a row of {len(rows)}"):
        _native_check.moe_weighted_rows(rows, row_of, weights)
    with pytest.raises(strata.InvalidArgument, match=r"weights\): expected .* of shape \(3, 3\); found \(3, 4\)"):
        _native_check.moe_weighted_rows(rows, row_of[:, :3], weights)
    src = rng.standard_normal((10, 32)).astype(np.float32)
    with pytest.raises(strata.InvalidArgument, match=r"gather_rows: index\[2\] = 10 is not a row of 10"):
        _native_check.gather_rows(src, [0, 9, 10])
    with pytest.raises(strata.InvalidArgument, match=r"gather_rows: index\[0\] = -1 is not a row of 10"):
        _native_check.gather_rows(src, [-1])


@pytest.mark.gpu
@pytest.mark.parametrize(("n_expert", "count"), [(8, 1), (512, 10), (512, 160), (64, 1000)])
def test_cache_slots(rng, n_expert, count):
    """A batch's routed pairs' cache slots on the device: slot_of[ids], the not-held -1 included."""
    slot_of = rng.permutation(n_expert).astype(np.int32)
    slot_of[rng.random(n_expert) < 0.3] = -1
    ids = rng.integers(0, n_expert, count).astype(np.int32)
    assert np.array_equal(_native_check.cache_slots(slot_of, ids), slot_of[ids])

