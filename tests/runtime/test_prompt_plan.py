"""The prompt path's plan on the CPU: the staging's bytes against what the native staging allocates, the chunk
scratch in the memory plan, and a chunk that does not fit halved rather than refused. The path itself on the
GPU is tests/session/test_prompt_path.py's."""

from __future__ import annotations

import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.runtime import prompt
from strata.runtime.expert_cache import expert_bytes
from strata.runtime.plan import file_tensors, memory_plan, prompt_scratch_bytes
from strata.synth import presets

from test_expert_cache import pool, tiny  # noqa: F401  (fixtures: three architectures, float and quantized)


def test_the_plan_counts_what_the_native_staging_allocates(tiny, pool):  # noqa: F811
    g, tensors = tiny.geometry, file_tensors(tiny)
    buffers = 2  # one fills over PCIe while the other is read
    for slots in (1, 3, g.n_expert):
        native = _native.ExpertStaging.bytes_for(pool.native, slots)
        planned = prompt.staging_bytes(pool, g.n_layer, slots)
        assert buffers * slots * max(expert_bytes(g, tensors)) <= native == planned, slots
    assert prompt.staging_bytes(pool, g.n_layer) == _native.ExpertStaging.bytes_for(pool.native, g.n_expert)
    with pytest.raises(InvalidArgument, match="slots must be in 1..8"):
        _native.ExpertStaging.bytes_for(pool.native, g.n_expert + 1)


def test_the_memory_plan_counts_the_staging_and_the_chunk(tiny):  # noqa: F811
    g, tensors = tiny.geometry, file_tensors(tiny)
    plain = memory_plan(g, tensors, 256)
    with_prompt = memory_plan(g, tensors, 256, prompt_staging=12345, prompt_chunk=64)
    assert with_prompt.vram["prompt staging"] == 12345
    assert with_prompt.vram["prompt scratch"] == prompt_scratch_bytes(g, 64, 256) > 0
    assert with_prompt.vram_total == plain.vram_total + 12345 + with_prompt.vram["prompt scratch"]
    assert "prompt scratch" not in plain.vram and "prompt staging" not in plain.vram


def test_the_chunk_scratch_grows_with_the_chunk():
    g = presets.geometry("qwen4exp", "bench")
    sizes = [prompt_scratch_bytes(g, chunk, 8192) for chunk in (64, 512, 4096)]
    assert sizes[0] < sizes[1] < sizes[2]
    # About linear in the rows: (4096 - 64) / (512 - 64) = 9 times the growth from 64 to 512 rows, give or take the
    # attention's span partials and the QSA scorer's rows in flight, which do not grow with every row.
    assert 8 < (sizes[2] - sizes[0]) / (sizes[1] - sizes[0]) < 10
    with pytest.raises(InvalidArgument, match="prompt chunk must be 1..8192 tokens"):
        prompt_scratch_bytes(g, 9000, 8192)


def test_a_chunk_that_does_not_fit_is_halved():
    g = presets.geometry("qwen4exp", "bench")
    need = {chunk: prompt_scratch_bytes(g, chunk, 8192) for chunk in (4096, 2048, 1024, 512, 64)}
    assert prompt.fitting_chunk(g, 8192, need[4096]) == 4096
    assert prompt.fitting_chunk(g, 8192, need[4096] - 1) == 2048
    assert prompt.fitting_chunk(g, 8192, need[1024]) == 1024
    assert prompt.fitting_chunk(g, 300, need[4096]) == 300  # never more than the context
    assert prompt.fitting_chunk(g, 8192, need[4096], asked=512) == 512
    assert prompt.fitting_chunk(g, 8192, need[64] - 1) == 0  # not even the smallest chunk: no prompt path
    with pytest.raises(InvalidArgument, match="prompt_chunk must be >= 1"):
        prompt.fitting_chunk(g, 8192, need[4096], asked=-3)
