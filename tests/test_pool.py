"""The CPU expert pool (cuda/src/cpu via strata.runtime.pool) against the numpy reference of strata.quant.

Every canonical quantized form, both expert shapes, both ISA paths (AVX-512 only where the CPU has it),
thread counts 1 and all. The reference applies the same activation contract: q8_32 of x, q8_32 of h.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
import strata.runtime.pool
from strata.quant import QuantTensor, matvec, repack
from strata.quant.synthetic import random_blocks

_native = pytest.importorskip("strata._native")
_native_check = pytest.importorskip("strata._native_check")

# The kernels reorder float32 sums (lanes, FMA, offsets folded per row) against numpy's per-group order:
# a few ulp of the largest partial sums over at most 80 blocks, far below 1e-5 of max|y|.
RTOL = 1e-5
N_EXPERT, K = 8, 4
SHAPES = {"qwen4exp": (2560, 640), "qwen3next": (2048, 512)}  # (n_embd, expert_ff)
TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
         T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0)
# What llama-quantize writes instead when a row is not whole 256-blocks (qwen4exp's down has 640 columns).
FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL,
            **dict.fromkeys((T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M), T.IQ4_NL),
            T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0}
SUPPORT = _native.cpu_isa_support()
ISAS = [pytest.param("avx2", marks=pytest.mark.skipif(not SUPPORT["avx2"], reason="CPU lacks AVX2+FMA+F16C")),
        pytest.param("avx512", marks=pytest.mark.skipif(not SUPPORT["avx512"], reason="CPU lacks AVX-512 VNNI"))]
WEIGHT_SEED = int(np.random.SeedSequence().entropy % (2**32))


def fitting_type(ggml_type: T, cols: int) -> T:
    return ggml_type if cols % 256 == 0 or ggml_type not in FALLBACK else FALLBACK[ggml_type]


@functools.lru_cache(maxsize=4)
def layer_weights(ggml_type: T, shape: str) -> tuple[QuantTensor, QuantTensor, QuantTensor]:
    """gate, up, down of N_EXPERT experts as repack makes them from the 3-D GGUF tensors (cached per type)."""
    rng = np.random.default_rng([WEIGHT_SEED, int(ggml_type), len(shape)])
    n_embd, ff = SHAPES[shape]

    def make(cols: int, rows: int) -> QuantTensor:
        t = fitting_type(ggml_type, cols)
        return repack(random_blocks(t, cols * rows * N_EXPERT, rng), t, (cols, rows, N_EXPERT))

    return make(n_embd, ff), make(n_embd, ff), make(ff, n_embd)


def expert(q: QuantTensor, e: int) -> QuantTensor:
    rows = q.rows // N_EXPERT
    return QuantTensor(q.form, rows, q.cols, **{n: p[e * rows:(e + 1) * rows] for n, p in q.planes().items()})


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert np.all(np.isfinite(got)), "non-finite output"
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def make_pool(ggml_type: T, shape: str, isa: str, threads: int | None = None) -> strata.runtime.pool.ExpertPool:
    n_embd, ff = SHAPES[shape]
    pool = strata.runtime.pool.ExpertPool(n_embd, ff, K, isa=isa, threads=threads)
    pool.set_layer(0, *layer_weights(ggml_type, shape), n_expert=N_EXPERT)
    return pool


def silu(g: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-g) = inf for very negative g gives silu = -0, as it should
        return (g.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32)


def check_layer(pool: strata.runtime.pool.ExpertPool, ggml_type: T, shape: str, rng: np.random.Generator) -> None:
    gate, up, down = layer_weights(ggml_type, shape)
    n_embd, _ = SHAPES[shape]
    x = rng.standard_normal(n_embd, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
    ids = rng.choice(N_EXPERT, K, replace=False).astype(np.int32)
    weights = rng.uniform(0.05, 1.0, K).astype(np.float32)
    skip = np.zeros(K, np.uint8)
    skip[rng.integers(K)] = 1  # one expert "in the GPU cache"
    out = np.full((K, n_embd), np.nan, np.float32)
    pool.run_layer(0, x, ids, weights, skip, out)
    note = f"seed {WEIGHT_SEED}, {ggml_type.name}, {shape}, {pool.isa}, ids {ids}, skip {skip}"
    for j in range(K):
        if skip[j]:
            assert np.all(np.isnan(out[j])), f"skipped row {j} was written ({note})"
            continue
        e = int(ids[j])
        g = _native_check.expert_matvec(pool.isa, expert(gate, e), x)
        u = _native_check.expert_matvec(pool.isa, expert(up, e), x)
        assert rel_err(g, matvec(expert(gate, e), x)) < RTOL, f"gate of expert {e} ({note})"
        assert rel_err(u, matvec(expert(up, e), x)) < RTOL, f"up of expert {e} ({note})"
        h = _native_check.expert_hidden(pool.isa, expert(gate, e), expert(up, e), x)  # the job's code, bit for bit
        # silu in float32 (native expf) vs float64 here: an ulp or two of each h.
        assert rel_err(h, silu(g) * u) < RTOL, f"h of slot {j} ({note})"
        # The reference quantizes the pool's h, so both sides see the same q8_32 of h.
        want = weights[j] * matvec(expert(down, e), h)
        assert rel_err(out[j], want) < RTOL, f"out row {j} (expert {e}) ({note})"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_layer_matches_reference(rng, ggml_type, shape, isa):
    with make_pool(ggml_type, shape, isa) as pool:
        check_layer(pool, ggml_type, shape, rng)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, None])
@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q2_K, T.Q8_0], ids=lambda t: t.name)
def test_layer_thread_counts(rng, ggml_type, threads, isa):
    with make_pool(ggml_type, "qwen3next", isa, threads=threads) as pool:
        assert pool.threads == (1 if threads == 1 else strata.runtime.pool.default_threads())
        for _ in range(3):  # repeated jobs reuse the workers and the scratch
            check_layer(pool, ggml_type, "qwen3next", rng)


def test_all_skipped_writes_nothing(rng):
    with make_pool(T.Q4_0, "qwen3next", "avx2") as pool:
        out = np.full((K, 2048), np.nan, np.float32)
        pool.run_layer(0, rng.standard_normal(2048, dtype=np.float32), np.arange(K), np.ones(K), np.ones(K), out)
        assert np.all(np.isnan(out))
