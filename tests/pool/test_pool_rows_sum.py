"""The CPU pool's routed experts of several rows in one call (ExpertPool.run_rows_sum): a step of several rows
(sessions stepped together, a verification's drafts) routes each row to its own k experts, and the pool computes
each expert of their union once for all its rows. Every row must be, bit for bit, what run_layer_sum gives that row
alone (the decode loop's answer): any mix of shared and distinct experts, skipped slots (the VRAM cache's), an
expert twice in a row, every row skipped, random (not power-of-two) weights. Outputs are poisoned (NaN) before
every run."""

from __future__ import annotations

import numpy as np
import pytest
from support.compare import assert_same_bits
from test_pool import ISAS, N_EXPERT, WEIGHT_SEED, every_layer_shape_and_isa
from test_pool_groups import K, MAX_ROWS, make_pool, random_x

import strata

_native = pytest.importorskip("strata._native")


def routing(rng: np.random.Generator, rows: int, shared: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids, weights and skip [rows, K]: each row's K distinct experts, a `shared` share of rows taking the first
    row's (so that groups hold several rows), about one slot in four skipped."""
    ids = np.stack([rng.choice(N_EXPERT, K, replace=False) for _ in range(rows)]).astype(np.int32)
    ids[rng.random(rows) < shared] = ids[0]
    weights = rng.uniform(0.01, 1.0, (rows, K)).astype(np.float32)
    skip = (rng.random((rows, K)) < 0.25).astype(np.uint8)
    return ids, weights, skip


def rows_alone(pool, x, ids, weights, skip) -> np.ndarray:
    want = np.full(x.shape, np.nan, np.float32)
    for r in range(x.shape[0]):
        pool.run_layer_sum(0, x[r], ids[r], weights[r], skip[r], out=want[r])
    return want


def run_rows(pool, x, ids, weights, skip) -> np.ndarray:
    out = np.full(x.shape, np.nan, np.float32)
    assert pool.run_rows_sum(0, x, ids, weights, skip, out) is out
    return out


@every_layer_shape_and_isa
def test_rows_are_each_rows_decode_answer(rng, layer, shape, isa):
    with make_pool(layer, shape, isa) as pool:
        for rows, shared in ((1, 0.0), (3, 0.5), (8, 0.3), (16, 0.0)):
            x = random_x(rng, rows, pool.n_embd)
            ids, weights, skip = routing(rng, rows, shared)
            note = f"seed {WEIGHT_SEED}, {layer}, {shape}, {pool.isa}, {rows} rows"
            assert_same_bits(run_rows(pool, x, ids, weights, skip), rows_alone(pool, x, ids, weights, skip), note)


@pytest.mark.parametrize("isa", ISAS)
def test_an_expert_twice_in_a_row_and_rows_all_skipped(rng, isa):
    with make_pool("Q4_K", "qwen3next", isa) as pool:
        x = random_x(rng, 4, pool.n_embd)
        ids, weights, skip = routing(rng, 4, 0.0)
        ids[1, 2] = ids[1, 0]  # run_layer_sum computes it twice, each with its own weight
        skip[:] = 0
        skip[3] = 1            # every slot of row 3 in the cache: zeros
        out = run_rows(pool, x, ids, weights, skip)
        assert_same_bits(out, rows_alone(pool, x, ids, weights, skip), f"seed {WEIGHT_SEED}")
        assert not out[3].any()
        skip[:] = 1
        assert not run_rows(pool, x, ids, weights, skip).any()


def test_the_union_must_fit_max_rows(rng):
    with make_pool("Q8_0", "qwen3next", "avx2" if _native.cpu_isa_support()["avx2"] else "avx512") as pool:
        rows = MAX_ROWS // K + 1
        x = random_x(rng, rows, pool.n_embd)
        ids, weights, _ = routing(rng, rows, 0.0)
        with pytest.raises(strata.InvalidArgument, match=f"more than the pool's max_rows {MAX_ROWS}"):
            pool.run_rows_sum(0, x, ids, weights, np.zeros(ids.shape, np.uint8))
        with pytest.raises(strata.InvalidArgument, match="run_rows_sum: ids are 2x4; weights"):
            pool.run_rows_sum(0, x[:2], ids[:2], weights[:2, :3])
