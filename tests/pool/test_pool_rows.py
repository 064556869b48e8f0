"""The quantized row kernels' passes over several weight rows (cuda/src/cpu/row_dot.inl).

rows_dot runs a row range in passes of four rows, then two, then one, each row in its own accumulators and
summed in the one-row order, so a row's result is the same bits whatever pass it runs in. Every quantized
form, rows of an odd block count and of one block (the two-block step's guarded half), call sizes 1..9 (each
leaves its own mix of passes and starts passes on rows of every residue); the one-row calls are checked against
the numpy reference (tests/support/pool_reference.py states the bound). Outputs are poisoned (NaN) by the hook.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from support.compare import assert_same_bits
from support.hooks import native_check as _native_check
from support.pool_reference import check_product
from test_pool import FLOATS, ISAS, SUPPORT, TYPES

import strata
from strata.quant import repack
from strata.quant.synthetic import random_blocks

pytest.importorskip("strata._native")

pytestmark = pytest.mark.hooks  # the benchmark the last test runs times the hooks too

QUANTIZED = [t for t in TYPES if t not in FLOATS]
ROWS = 37  # nine passes of four and one of one in a single call


def columns(ggml_type: T) -> tuple[int, ...]:
    """One block, an odd block count and a down row of qwen4exp; whole super-blocks for the 256-element types."""
    return (32, 544, 640) if GGML_QUANT_SIZES[ggml_type][0] == 32 else (256, 768, 2560)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=lambda t: t.name)
def test_a_row_is_the_same_bits_in_every_pass(rng, ggml_type, isa):
    for cols in columns(ggml_type):
        q = repack(random_blocks(ggml_type, ROWS * cols, rng), ggml_type, (cols, ROWS))
        x = rng.standard_normal(cols, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
        one_by_one = _native_check.expert_matvec(isa, q, x, rows_per_call=1)
        check_product(one_by_one, q, x, 1.0, f"{ggml_type.name}, {cols} columns, {isa}, one row a call")
        for n in (*range(2, 10), 0):
            assert_same_bits(_native_check.expert_matvec(isa, q, x, rows_per_call=n), one_by_one,
                       f"{ggml_type.name}, {cols} columns, {isa}, {n} rows a call against one a call")


@pytest.mark.skipif(not SUPPORT["avx2"], reason="CPU lacks AVX2+FMA+F16C")
@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=lambda t: t.name)
def test_the_avx512_kernels_source_matches_avx2_bit_for_bit(rng, ggml_type):
    """The AVX-512 kernels' IntDot (int_dot_vnni.inl) with vpdpbusd emulated, on any AVX2 CPU: both ISAs make the
    same exact int32 dots and share the rest (row_dot.inl), so their rows agree to the bit, in every pass."""
    for cols in columns(ggml_type):
        q = repack(random_blocks(ggml_type, ROWS * cols, rng), ggml_type, (cols, ROWS))
        x = rng.standard_normal(cols, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
        for n in (0, 1, 3):
            assert_same_bits(_native_check.emulated_vnni_matvec(q, x, rows_per_call=n),
                       _native_check.expert_matvec("avx2", q, x, rows_per_call=n),
                       f"{ggml_type.name}, {cols} columns, {n} rows a call, emulated VNNI against AVX2")


@pytest.mark.skipif(not SUPPORT["avx512"], reason="CPU lacks AVX-512 VNNI")
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q4_K, T.Q8_0, T.IQ4_NL, T.Q6_K], ids=lambda t: t.name)
def test_the_vpdpbusd_emulation_matches_the_instruction(rng, ggml_type):
    cols = columns(ggml_type)[-1]
    q = repack(random_blocks(ggml_type, ROWS * cols, rng), ggml_type, (cols, ROWS))
    x = rng.standard_normal(cols, dtype=np.float32)
    assert_same_bits(_native_check.emulated_vnni_matvec(q, x), _native_check.expert_matvec("avx512", q, x),
               f"{ggml_type.name}, emulated VNNI against the instruction")


def test_the_emulated_kernels_refuse_a_float_matrix(rng):
    w = rng.standard_normal((4, 64), dtype=np.float32)
    with pytest.raises(strata.InvalidArgument, match="quantized forms only"):
        _native_check.emulated_vnni_matvec(w, rng.standard_normal(64, dtype=np.float32))


@pytest.mark.parametrize("isa", ISAS)
def test_time_expert_rows_times_the_rows_it_is_asked_for(rng, isa):
    """benchmarks/bench_pool_kernels.py's timer: more calls take longer, and bad sizes are refused by name."""
    cols, rows, n_expert = 640, 64, 3
    q = repack(random_blocks(T.Q4_0, n_expert * rows * cols, rng), T.Q4_0, (cols, n_expert * rows))
    x = rng.standard_normal(cols, dtype=np.float32)
    few = _native_check.time_expert_rows(isa, q, n_expert, x, rows, 10)
    many = _native_check.time_expert_rows(isa, q, n_expert, x, rows, 1000)
    assert 0 < few < many, (few, many)
    with pytest.raises(strata.InvalidArgument, match="rows must be in 1..64"):
        _native_check.time_expert_rows(isa, q, n_expert, x, rows + 1, 10)
    with pytest.raises(strata.InvalidArgument, match="calls must be >= 1"):
        _native_check.time_expert_rows(isa, q, n_expert, x, rows, 0)
    with pytest.raises(strata.InvalidArgument, match="x has 639 entries"):
        _native_check.time_expert_rows(isa, q, n_expert, x[:-1], rows, 10)


@pytest.mark.skipif(not SUPPORT["avx2"], reason="CPU lacks AVX2+FMA+F16C")
def test_bench_pool_kernels_runs_the_cases_it_is_asked_for(capsys):
    """benchmarks/bench_pool_kernels.py's filters and repeats: one row per form and width asked for, a fitting
    fallback where the width cannot hold the form, no streamed or gapped run with cached_only, both without."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pool_kernels.py"
    spec = importlib.util.spec_from_file_location("bench_pool_kernels", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.run("avx2", quick=True, forms=[T.Q4_K, T.Q4_0], widths=[256, 96], cached_only=True, repeat=2)
    assert [(r["form"], r["cols"]) for r in rows] == [("Q4_K", 256), ("Q5_0", 96), ("Q4_0", 256), ("Q4_0", 96)]
    for r in rows:
        assert 0 < r["cached_ns_per_block"] < 1e6 and r["cached_gb_per_s"] > 0, r
        assert r["streamed_gb_per_s"] is None and r["gapped_gb_per_s"] is None, r
    assert capsys.readouterr().out.count("RESULT pool_kernel") == 4
    rows = bench.run("avx2", quick=True, forms=[T.Q8_0], widths=[64], repeat=1)
    assert rows[0]["streamed_gb_per_s"] > 0 and rows[0]["gapped_gb_per_s"] > 0, rows
