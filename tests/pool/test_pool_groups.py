"""The CPU pool's grouped route (ExpertPool.run_groups): a prompt chunk's routed rows, grouped by expert.

Every row must equal what run_layer computes for that token and expert, bit for bit: run_layer scales its
row by the routing weight, so the tokens here take powers of two (2^0 .. 2^-3), for which weight * row is
exact and run_layer's row / weight is run_groups' row itself. Rows are checked against the numpy reference too
(tests/support/pool_reference.py states its bounds). Outputs are poisoned (NaN) before every run.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from support.compare import assert_same_bits
from support.pool_reference import check_expert
from test_pool import ISAS, N_EXPERT, SHAPES, WEIGHT_SEED, every_layer_shape_and_isa, expert, layer_weights

import strata
import strata.runtime.pool
from strata.quant import repack
from strata.quant.synthetic import random_blocks

_native = pytest.importorskip("strata._native")

K = 4
MAX_ROWS = 320
# Layers of the sweeps over group sizes and thread counts: one per kernel family and mix.
SWEEP_LAYERS = ["Q4_K", "Q2_K", "Q8_0", "IQ4_XS", "BF16", "F32", "BF16+Q8_0", "Q4_K+F16"]


def make_pool(layer: str, shape: str, isa: str, threads: int | None = None) -> strata.runtime.pool.ExpertPool:
    n_embd, ff = SHAPES[shape]
    pool = strata.runtime.pool.ExpertPool(n_embd, ff, K, isa=isa, threads=threads, max_rows=MAX_ROWS)
    pool.set_layer(0, *layer_weights(layer, shape), n_expert=N_EXPERT)
    return pool


def random_x(rng: np.random.Generator, rows: int, n_embd: int) -> np.ndarray:
    """Rows of very different scales, as a chunk's hidden states are."""
    scales = rng.uniform(0.1, 10, (rows, 1)).astype(np.float32)
    return rng.standard_normal((rows, n_embd), dtype=np.float32) * scales


def run_groups(pool: strata.runtime.pool.ExpertPool, x: np.ndarray, experts: np.ndarray,
               begin: np.ndarray) -> np.ndarray:
    out = np.full((int(begin[-1]), pool.n_embd), np.nan, np.float32)
    assert pool.run_groups(0, x, experts, begin, out) is out
    return out


def sizes_to_begin(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)


def per_row_run_layer(pool: strata.runtime.pool.ExpertPool, x: np.ndarray, experts: np.ndarray,
                      begin: np.ndarray) -> np.ndarray:
    """Each row of each group through run_layer alone (k = 1, weight 1)."""
    want = np.full((x.shape[0], pool.n_embd), np.nan, np.float32)
    for g, e in enumerate(experts):
        for r in range(begin[g], begin[g + 1]):
            pool.run_layer(0, x[r], np.array([e], np.int32), np.ones(1, np.float32), out=want[r:r + 1])
    return want


def check_some_rows_against_numpy(pool: strata.runtime.pool.ExpertPool, layer: str, shape: str, x: np.ndarray,
                                  experts: np.ndarray, begin: np.ndarray, out: np.ndarray,
                                  rng: np.random.Generator, n: int, note: str) -> None:
    gate, up, down = layer_weights(layer, shape)
    group_of_row = np.repeat(np.arange(len(experts)), np.diff(begin))
    for r in rng.choice(x.shape[0], min(n, x.shape[0]), replace=False):
        e = int(experts[group_of_row[r]])
        check_expert(pool.isa, expert(gate, e), expert(up, e), expert(down, e), x[r], 1.0, out[r],
                     f"row {r}, expert {e}, {note}")


@every_layer_shape_and_isa
def test_chunk_matches_run_layer_per_token(rng, layer, shape, isa):
    """A chunk of tokens, K experts each, grouped by expert as the prompt path groups them."""
    n_embd, _ = SHAPES[shape]
    tokens = 12
    x = random_x(rng, tokens, n_embd)
    ids = np.stack([rng.choice(N_EXPERT, K, replace=False) for _ in range(tokens)]).astype(np.int32)
    weights = (2.0 ** -rng.integers(0, 4, (tokens, K))).astype(np.float32)
    order = np.argsort(ids.reshape(-1), kind="stable")  # (token, choice) pairs by expert
    experts, sizes = np.unique(ids.reshape(-1), return_counts=True)
    begin = sizes_to_begin(list(sizes))
    note = f"seed {WEIGHT_SEED}, {layer}, {shape}, {isa}"
    with make_pool(layer, shape, isa) as pool:
        out = run_groups(pool, x[order // K], experts.astype(np.int32), begin)
        per_token = np.full((tokens, K, n_embd), np.nan, np.float32)
        for t in range(tokens):
            pool.run_layer(0, x[t], ids[t], weights[t], out=per_token[t])
        unweighted = (per_token / weights[..., None]).reshape(tokens * K, n_embd)
        assert_same_bits(out, unweighted[order], note)
        check_some_rows_against_numpy(pool, layer, shape, x[order // K], experts, begin, out, rng, 3, note)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, None])
@pytest.mark.parametrize("layer", SWEEP_LAYERS)
@pytest.mark.hooks
def test_group_sizes(rng, layer, threads, isa):
    """Empty groups, a single row, a few rows and more rows than one block holds (300), in one call."""
    n_embd, _ = SHAPES["qwen4exp"]
    sizes = [0, 1, 7, 300, 0]
    experts = rng.choice(N_EXPERT, len(sizes), replace=False).astype(np.int32)
    begin = sizes_to_begin(sizes)
    x = random_x(rng, int(begin[-1]), n_embd)
    note = f"seed {WEIGHT_SEED}, {layer}, threads {threads}, {isa}"
    with make_pool(layer, "qwen4exp", isa, threads=threads) as pool:
        out = run_groups(pool, x, experts, begin)
        assert_same_bits(out, per_row_run_layer(pool, x, experts, begin), note)
        check_some_rows_against_numpy(pool, layer, "qwen4exp", x, experts, begin, out, rng, 3, note)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layer", ["Q4_K", "Q5_0", "F16", "F16|Q8_0|BF16"])
def test_many_groups_and_repeated_calls(rng, layer, isa):
    """Many groups (experts repeated, sizes 0..9, rows of an odd block count); calls reuse the scratch. At most
    MAX_ROWS // 9 groups, so that every draw fits the pool's max_rows (59 groups could hold 531 rows)."""
    n_embd, _ = SHAPES["odd"]
    with make_pool(layer, "odd", isa) as pool:
        for _ in range(3):
            groups = int(rng.integers(20, MAX_ROWS // 9 + 1))
            experts = rng.integers(0, N_EXPERT, groups).astype(np.int32)
            begin = sizes_to_begin(list(rng.integers(0, 10, groups)))
            x = random_x(rng, int(begin[-1]), n_embd)
            out = run_groups(pool, x, experts, begin)
            assert_same_bits(out, per_row_run_layer(pool, x, experts, begin), f"seed {WEIGHT_SEED}, {layer}")


@pytest.mark.hooks
def test_the_benchmark_forms(rng):
    """Q4_K gate/up and a Q4_0 down (the benchmark model's experts), a full max_rows call, against numpy."""
    n_embd, ff = SHAPES["qwen4exp"]

    def make(ggml_type: T, cols: int, rows: int):
        return repack(random_blocks(ggml_type, cols * rows * N_EXPERT, rng), ggml_type, (cols, rows, N_EXPERT))

    gate, up, down = make(T.Q4_K, n_embd, ff), make(T.Q4_K, n_embd, ff), make(T.Q4_0, ff, n_embd)
    sizes = list(rng.multinomial(MAX_ROWS, np.ones(N_EXPERT) / N_EXPERT))
    begin, experts = sizes_to_begin(sizes), rng.permutation(N_EXPERT).astype(np.int32)
    x = random_x(rng, MAX_ROWS, n_embd)
    with strata.runtime.pool.ExpertPool(n_embd, ff, 1, isa="avx2", max_rows=MAX_ROWS) as pool:
        pool.set_layer(0, gate, up, down, n_expert=N_EXPERT)
        out = run_groups(pool, x, experts, begin)
        assert_same_bits(out, per_row_run_layer(pool, x, experts, begin), "Q4_K/Q4_0")
        group_of_row = np.repeat(np.arange(N_EXPERT), sizes)
        for r in rng.choice(MAX_ROWS, 4, replace=False):
            e = int(experts[group_of_row[r]])
            check_expert("avx2", expert(gate, e), expert(up, e), expert(down, e), x[r], 1.0, out[r], f"row {r}")


def test_empty_calls_write_nothing(rng):
    with make_pool("Q4_0", "qwen3next", "avx2") as pool:
        n_embd = pool.n_embd
        assert pool.run_groups(0, np.empty((0, n_embd)), np.empty(0), np.zeros(1)).shape == (0, n_embd)
        assert pool.run_groups(0, np.empty((0, n_embd)), np.array([3, 5]), np.zeros(3)).shape == (0, n_embd)


def test_bad_arguments_are_named(rng):
    n_embd = SHAPES["qwen3next"][0]
    x = random_x(rng, 4, n_embd)
    with make_pool("Q4_0", "qwen3next", "avx2") as pool:
        with pytest.raises(strata.InvalidArgument, match="layer 2 has no experts registered"):
            pool.run_groups(2, x, np.array([0]), np.array([0, 4]))
        with pytest.raises(strata.InvalidArgument, match=r"layer 0 experts\[1\] = 8 is outside 0..7"):
            pool.run_groups(0, x, np.array([0, 8]), np.array([0, 2, 4]))
        with pytest.raises(strata.InvalidArgument, match=r"begin\[0\] must be 0, found 1"):
            pool.run_groups(0, x[:3], np.array([0]), np.array([1, 3]))
        with pytest.raises(strata.InvalidArgument, match=r"begin\[2\] = 1 is below begin\[1\] = 3"):
            pool.run_groups(0, x[:1], np.array([0, 1]), np.array([0, 3, 1]))
        with pytest.raises(strata.InvalidArgument, match="experts has 2 entries, so begin must have 3, found 2"):
            pool.run_groups(0, x, np.array([0, 1]), np.array([0, 4]))
        with pytest.raises(strata.InvalidArgument, match=f"x is 4x{n_embd}, begin.* ask for 3x{n_embd}"):
            pool.run_groups(0, x, np.array([0]), np.array([0, 3]))
        with pytest.raises(strata.InvalidArgument, match=f"out is 4x{n_embd}, must be 3x{n_embd}"):
            pool.run_groups(0, x[:3], np.array([0]), np.array([0, 3]), out=np.empty((4, n_embd), np.float32))
        many = MAX_ROWS + 1
        with pytest.raises(strata.InvalidArgument, match=f"hold {many} rows, more than the pool's max_rows {MAX_ROWS}"):
            pool.run_groups(0, random_x(rng, many, n_embd), np.array([0]), np.array([0, many]))
    with strata.runtime.pool.ExpertPool(n_embd, 512, 1) as pool:
        pool.set_layer(0, *layer_weights("Q4_0", "qwen3next"), n_expert=N_EXPERT)
        with pytest.raises(strata.InvalidArgument, match="more than the pool's max_rows 0"):
            pool.run_groups(0, x, np.array([0]), np.array([0, 4]))
    with pytest.raises(strata.InvalidArgument, match="max_rows must be in 0..1048576, found -1"):
        strata.runtime.pool.ExpertPool(n_embd, 512, 1, max_rows=-1)
