"""The CPU expert pool (cuda/src/cpu via strata.runtime.pool) against the numpy reference of strata.quant.

Every canonical form, float and quantized, and layers that mix them; both expert shapes, both ISA paths
(AVX-512 only where the CPU has it), thread counts 1 and all. The reference applies the same activation
contract: q8_32 of x and of h for a quantized matrix, float32 x and h for a float one (tests/support/pool_reference.py
states the bounds).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from support.pool_reference import Weight, check_expert

import strata
import strata.runtime.pool
from strata.quant import QuantTensor, repack
from strata.quant.forms import fitting_type
from strata.quant.synthetic import random_blocks

_native = pytest.importorskip("strata._native")

N_EXPERT, K = 8, 4
MODELS = {"qwen4exp": (2560, 640), "qwen3next": (2048, 512)}  # (n_embd, expert_ff)
# Rows of an odd number of 32-blocks: the AVX-512 float kernels' steps are 64 elements, this leaves half a one.
SHAPES = MODELS | {"odd": (2080, 544)}
FLOATS = (T.F32, T.F16, T.BF16)
TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
         T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, *FLOATS)
# A layer's (gate, up, down) types: one type throughout, or float and quantized matrices mixed.
LAYERS = {t.name: (t, t, t) for t in TYPES} | {
    "BF16+Q8_0": (T.BF16, T.BF16, T.Q8_0),    # float gate/up, quantized down: h quantized, x not
    "Q4_K+F16": (T.Q4_K, T.Q4_K, T.F16),      # quantized gate/up, float down: x quantized, h not
    "F16|Q8_0|BF16": (T.F16, T.Q8_0, T.BF16),  # x both ways in one layer
}
SUPPORT = _native.cpu_isa_support()
ISAS = [pytest.param("avx2", marks=pytest.mark.skipif(not SUPPORT["avx2"], reason="CPU lacks AVX2+FMA+F16C")),
        pytest.param("avx512", marks=pytest.mark.skipif(not SUPPORT["avx512"], reason="CPU lacks AVX-512 VNNI"))]
WEIGHT_SEED = int(np.random.SeedSequence().entropy % (2**32))


def every_layer_shape_and_isa(test):
    """`test` over every layer mix, both expert shapes and both ISA paths (the test library's hooks marked)."""
    for mark in (pytest.mark.hooks, pytest.mark.parametrize("layer", list(LAYERS)),
                 pytest.mark.parametrize("shape", list(MODELS)), pytest.mark.parametrize("isa", ISAS)):
        test = mark(test)
    return test


@functools.lru_cache(maxsize=4)
def layer_weights(layer: str, shape: str) -> tuple[Weight, Weight, Weight]:
    """gate, up, down of N_EXPERT experts as repack makes them from the 3-D GGUF tensors (cached per layer)."""
    rng = np.random.default_rng([WEIGHT_SEED, *(int(t) for t in LAYERS[layer]), len(shape)])
    n_embd, ff = SHAPES[shape]

    def make(ggml_type: T, cols: int, rows: int) -> Weight:
        t = fitting_type(ggml_type, cols)
        return repack(random_blocks(t, cols * rows * N_EXPERT, rng), t, (cols, rows, N_EXPERT))

    gate_type, up_type, down_type = LAYERS[layer]
    return make(gate_type, n_embd, ff), make(up_type, n_embd, ff), make(down_type, ff, n_embd)


def expert(q: Weight, e: int) -> Weight:
    if isinstance(q, np.ndarray):
        rows = q.shape[0] // N_EXPERT
        return q[e * rows:(e + 1) * rows]
    rows = q.rows // N_EXPERT
    return QuantTensor(q.form, rows, q.cols, **{n: p[e * rows:(e + 1) * rows] for n, p in q.planes().items()})


def make_pool(layer: str, shape: str, isa: str, threads: int | None = None) -> strata.runtime.pool.ExpertPool:
    n_embd, ff = SHAPES[shape]
    pool = strata.runtime.pool.ExpertPool(n_embd, ff, K, isa=isa, threads=threads)
    pool.set_layer(0, *layer_weights(layer, shape), n_expert=N_EXPERT)
    return pool


def check_layer(pool: strata.runtime.pool.ExpertPool, layer: str, shape: str, rng: np.random.Generator) -> None:
    gate, up, down = layer_weights(layer, shape)
    n_embd, _ = SHAPES[shape]
    x = rng.standard_normal(n_embd, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
    ids = rng.choice(N_EXPERT, K, replace=False).astype(np.int32)
    weights = rng.uniform(0.05, 1.0, K).astype(np.float32)
    skip = np.zeros(K, np.uint8)
    skip[rng.integers(K)] = 1  # one expert "in the GPU cache"
    out = np.full((K, n_embd), np.nan, np.float32)
    pool.run_layer(0, x, ids, weights, skip, out)
    note = f"seed {WEIGHT_SEED}, {layer}, {shape}, {pool.isa}, ids {ids}, skip {skip}"
    for j in range(K):
        if skip[j]:
            assert np.all(np.isnan(out[j])), f"skipped row {j} was written ({note})"
            continue
        e = int(ids[j])
        check_expert(pool.isa, expert(gate, e), expert(up, e), expert(down, e), x, float(weights[j]), out[j],
                     f"row {j}, expert {e}, {note}")


@every_layer_shape_and_isa
def test_layer_matches_reference(rng, layer, shape, isa):
    with make_pool(layer, shape, isa) as pool:
        check_layer(pool, layer, shape, rng)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layer", [name for name, types in LAYERS.items() if set(types) & set(FLOATS)])
@pytest.mark.hooks
def test_float_rows_of_an_odd_block_count(rng, layer, isa):
    with make_pool(layer, "odd", isa) as pool:
        check_layer(pool, layer, "odd", rng)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, None])
@pytest.mark.parametrize("layer", ["Q4_K", "Q2_K", "Q8_0", "BF16", "BF16+Q8_0"])
@pytest.mark.hooks
def test_layer_thread_counts(rng, layer, threads, isa):
    with make_pool(layer, "qwen3next", isa, threads=threads) as pool:
        assert pool.threads == (1 if threads == 1 else strata.runtime.pool.default_threads())
        for _ in range(3):  # repeated jobs reuse the workers and the scratch
            check_layer(pool, layer, "qwen3next", rng)


@pytest.mark.parametrize("layer", ["Q4_0", "F16"])
def test_all_skipped_writes_nothing(rng, layer):
    with make_pool(layer, "qwen3next", "avx2") as pool:
        out = np.full((K, 2048), np.nan, np.float32)
        pool.run_layer(0, rng.standard_normal(2048, dtype=np.float32), np.arange(K), np.ones(K), np.ones(K), out)
        assert np.all(np.isnan(out))


def rows_summed(rows: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """The rows not skipped, added in order from zero in float32: the sum run_layer_sum promises bit for bit."""
    total = np.zeros(rows.shape[1], np.float32)
    for j in np.flatnonzero(skip == 0):
        total += rows[j]
    return total


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, None])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("layer", ["Q4_K", "Q4_0", "Q8_0", "IQ4_NL", "BF16", "Q4_K+F16", "BF16+Q8_0"])
@pytest.mark.hooks
def test_layer_sum_is_the_rows_summed(rng, layer, shape, threads, isa):
    """The decode loop's job (each participant sums a row range over every expert, no barrier between the gate/up
    and down items) against run_layer's rows summed in order; repeated jobs with fresh ids and skips, so an item
    that read an expert's h before it was complete would show."""
    n_embd, _ = SHAPES[shape]
    with make_pool(layer, shape, isa, threads=threads) as pool:
        for job in range(6):
            x = rng.standard_normal(n_embd, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
            ids = rng.choice(N_EXPERT, K, replace=False).astype(np.int32)
            weights = rng.uniform(0.05, 1.0, K).astype(np.float32)
            skip = (rng.random(K) < 0.3).astype(np.uint8)
            rows = np.full((K, n_embd), np.nan, np.float32)
            pool.run_layer(0, x, ids, weights, skip, rows)
            got = np.full(n_embd, np.nan, np.float32)
            pool.run_layer_sum(0, x, ids, weights, skip, got)
            note = f"seed {WEIGHT_SEED}, {layer}, {shape}, {pool.isa}, job {job}, ids {ids}, skip {skip}"
            assert np.all(np.isfinite(got)), note
            np.testing.assert_array_equal(got.view(np.uint32), rows_summed(rows, skip).view(np.uint32), note)


@pytest.mark.parametrize("layer", ["Q4_0", "F16"])
def test_layer_sum_of_nothing_is_zeros(rng, layer):
    with make_pool(layer, "qwen3next", "avx2") as pool:
        out = np.full(2048, np.nan, np.float32)
        pool.run_layer_sum(0, rng.standard_normal(2048, dtype=np.float32), np.arange(K), np.ones(K), np.ones(K), out)
        assert np.all(out == 0)
        assert pool.run_layer_sum(0, np.ones(2048, np.float32), np.zeros(0, np.int32), np.zeros(0)).tolist() == \
            [0.0] * 2048
