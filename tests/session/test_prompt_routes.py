"""The prompt path's grouping of a chunk's routing (cuda/src/session/experts/chunk_routes.hpp), on the host: each routed
expert's (token, choice) pairs become consecutive product rows, the cache's experts first, then the staging's
fill by fill, and row_of takes each pair back to its row. Checked against a statement of the rules in Python."""

import numpy as np
import pytest

from strata.errors import InvalidArgument

from support.hooks import native_check

pytestmark = pytest.mark.hooks


def expected(ids: np.ndarray, n_expert: int, cache: list[int], slots: int, prefetched: list[int],
             on_cpu: list[bool] | None = None) -> dict:
    """The rules: pairs in (token, choice) order; cached experts (ascending) first, then the CPU's (ascending),
    then the staged ones (ascending) in fills of at most `slots` experts, or the one prefetched fill, slots
    numbered within it."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    touched = sorted(set(flat.tolist()))
    held = [e for e in touched if cache and cache[e] >= 0]
    pooled = [e for e in touched if e not in held and on_cpu and on_cpu[e]]
    staged = [e for e in touched if e not in held and e not in pooled]
    if prefetched:
        fills = [prefetched]
        slot = {e: prefetched.index(e) for e in staged}
    else:
        fills = [staged[i:i + slots] for i in range(0, len(staged), slots)]
        slot = {e: fill.index(e) for fill in fills for e in fill}
    slot.update({e: cache[e] for e in held})
    slot.update({e: -1 for e in pooled})  # the pool's groups name experts (the "cpu" entry), not slots
    order = held + pooled + staged
    row_token, row_of = [], [0] * flat.size
    for e in order:
        for p in np.flatnonzero(flat == e):
            row_of[p] = len(row_token)
            row_token.append(int(p) // k)
    cached_rows = int(np.isin(flat, held).sum())

    def part(experts: list[int], first: int) -> tuple[list[int], list[int]]:
        """One group per routed expert of the part: its slot, and its rows' begin from the part's first row."""
        routed = [e for e in experts if e in touched]
        begins = [row_of[int(np.flatnonzero(flat == e)[0])] - first for e in routed]
        return [slot[e] for e in routed], begins + [int(np.isin(flat, routed).sum())]

    cpu_rows = int(np.isin(flat, pooled).sum())
    first, out_fills, parts = cached_rows + cpu_rows, [], [part(held, 0), part(pooled, cached_rows)]
    for fill in fills:
        rows = int(np.isin(flat, [e for e in fill if e in staged]).sum())
        out_fills.append((list(fill), first, rows))
        parts.append(part([e for e in fill if e in staged], first))
        first += rows
    return {"row_token": row_token, "row_of": row_of, "cached_rows": cached_rows,
            "cached_experts": len(held), "cpu": (pooled, cached_rows, cpu_rows), "fills": out_fills, "parts": parts}


def routing(rng, tokens: int, k: int, n_expert: int) -> np.ndarray:
    return np.stack([rng.choice(n_expert, size=k, replace=False) for _ in range(tokens)]).astype(np.int32)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tokens,k,n_expert,slots", [(1, 2, 8, 8), (37, 4, 64, 64), (300, 10, 128, 20)])
def test_grouping_matches_the_rules(seed, tokens, k, n_expert, slots):
    rng = np.random.default_rng(seed)
    ids = routing(rng, tokens, k, n_expert)
    for cache in ([], [int(s) if h else -1 for s, h in zip(rng.permutation(n_expert), rng.random(n_expert) < 0.3)]):
        got = native_check.group_routes(ids, n_expert, cache, slots, [])
        assert got == expected(ids, n_expert, cache, slots, [])
        # Every pair's row reads its own token, and the rows of the staging's fills are at most `slots` experts.
        assert [got["row_token"][r] for r in got["row_of"]] == [p // k for p in range(tokens * k)]
        assert all(len(experts) <= slots for experts, _, _ in got["fills"])


@pytest.mark.parametrize("seed", range(6))
def test_the_cpus_share_comes_between_the_cache_and_the_staging(seed):
    rng = np.random.default_rng(seed)
    n_expert, k, slots = 64, 4, 16
    ids = routing(rng, 40, k, n_expert)
    cache = [int(s) if h else -1 for s, h in zip(rng.permutation(n_expert), rng.random(n_expert) < 0.25)]
    on_cpu = [bool(b) for b in rng.random(n_expert) < 0.4]  # some of them cached: those stay the cache's
    got = native_check.group_routes(ids, n_expert, cache, slots, [], on_cpu)
    assert got == expected(ids, n_expert, cache, slots, [], on_cpu)
    experts, first, rows = got["cpu"]
    assert all(on_cpu[e] and cache[e] < 0 for e in experts) and first == got["cached_rows"]


@pytest.mark.parametrize("seed", range(4))
def test_prefetched_fill_is_the_whole_uncached_layer(seed):
    rng = np.random.default_rng(seed)
    n_expert, k = 32, 4
    ids = routing(rng, 50, k, n_expert)
    cache = [e if e % 3 == 0 else -1 for e in range(n_expert)]
    ahead = [e for e in range(n_expert) if cache[e] < 0]
    got = native_check.group_routes(ids, n_expert, cache, n_expert, ahead)
    assert got == expected(ids, n_expert, cache, n_expert, ahead)
    assert len(got["fills"]) == 1 and got["fills"][0][0] == ahead


def test_refusals_name_the_problem():
    ids = np.array([[0, 5]], dtype=np.int32)
    with pytest.raises(InvalidArgument, match="chose expert 5 of a layer of 4"):
        native_check.group_routes(ids, 4, [], 4, [])
    with pytest.raises(InvalidArgument, match="neither cached nor prefetched"):
        native_check.group_routes(np.array([[0, 1]], dtype=np.int32), 4, [], 4, [0, 2])
    with pytest.raises(InvalidArgument, match="the cache map has 3 experts"):
        native_check.group_routes(np.array([[0, 1]], dtype=np.int32), 4, [0, -1, -1], 4, [])
    with pytest.raises(InvalidArgument, match="the CPU takes none of them"):
        native_check.group_routes(np.array([[0, 1]], dtype=np.int32), 4, [], 4, [0, 1, 2, 3], [True] * 4)
