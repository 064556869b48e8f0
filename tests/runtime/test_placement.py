"""A load's placement of its routed experts on the CPU (strata.runtime.placement): the cache's slots and bytes by
the native figures, an explicit budget refused where the smallest session would not fit beside it, "auto" leaving
room for the default session, and the staging placed only where it fits. The load itself on the GPU is
tests/session/test_decode_session.py's."""

from __future__ import annotations

import pytest

from strata import _native
from strata.errors import OutOfMemory
from strata.options import DEFAULT_KV
from strata.runtime import expert_cache, prompt
from strata.runtime.placement import place_experts
from strata.runtime.plan import file_tensors, kv_page_tokens, memory_plan, prompt_scratch_bytes

from test_expert_cache import pool, tiny  # noqa: F401  (fixtures: three architectures, float and quantized)


def placed(tiny, pool, budget, free, prompt_path=True):  # noqa: F811
    g, tensors = tiny.geometry, file_tensors(tiny)
    plan = memory_plan(g, tensors, kv_page_tokens(), DEFAULT_KV)
    return place_experts(g, tensors, plan, pool, budget, free, 3, prompt_path), plan


def test_an_explicit_budget_gets_the_slots_it_holds(tiny, pool):  # noqa: F811
    g = tiny.geometry
    half = expert_cache.cache_bytes(pool, [g.n_expert // 2] * g.n_layer)
    placement, _ = placed(tiny, pool, half, 1 << 40)
    assert placement.cache_slots == [g.n_expert // 2] * g.n_layer
    assert placement.cache_bytes == _native.ExpertCache.bytes_for(pool.native, placement.cache_slots) == half
    assert not placement.whole and placement.staged
    assert placement.staging_bytes == _native.ExpertStaging.bytes_for(pool.native, g.n_expert)
    assert placement.staging_free == (1 << 40) - half
    placement, _ = placed(tiny, pool, half, 1 << 40, prompt_path=False)
    assert placement.cache_slots == [g.n_expert // 2] * g.n_layer and not placement.wants_staging


def test_a_budget_beyond_every_expert_holds_them_all_and_needs_no_staging(tiny, pool):  # noqa: F811
    g = tiny.geometry
    placement, _ = placed(tiny, pool, 1 << 40, 1 << 41)
    assert placement.cache_slots == [g.n_expert] * g.n_layer and placement.whole
    assert placement.cache_bytes == expert_cache.cache_bytes(pool, [g.n_expert] * g.n_layer)
    assert not placement.wants_staging and not placement.staged


def test_an_explicit_budget_that_leaves_no_room_for_the_smallest_session_is_refused(tiny, pool):  # noqa: F811
    g, tensors = tiny.geometry, file_tensors(tiny)
    plan = memory_plan(g, tensors, kv_page_tokens(), DEFAULT_KV)
    smallest = plan.vram_total - plan.vram["dense weights"]
    budget = expert_cache.cache_bytes(pool, [1] * g.n_layer)
    placed(tiny, pool, budget, smallest + budget)  # exactly fits
    with pytest.raises(OutOfMemory, match=r"expert_cache of .* GiB does not fit: GPU 3 has .* the smallest session "
                                          r"needs .*\(or expert_cache='auto'\)"):
        placed(tiny, pool, budget, smallest + budget - 1)


def test_auto_leaves_the_default_session_the_staging_and_the_reserve(tiny, pool):  # noqa: F811
    g, tensors = tiny.geometry, file_tensors(tiny)
    everything = expert_cache.cache_bytes(pool, [g.n_expert] * g.n_layer)
    plan = memory_plan(g, tensors, kv_page_tokens(), DEFAULT_KV)
    context = min(g.context_length, 4096)
    session = memory_plan(g, tensors, context, DEFAULT_KV, prompt_chunk=min(prompt.DEFAULT_CHUNK, context))
    beside = session.vram_total - plan.vram["dense weights"] + expert_cache.RESERVE_BYTES
    whole, _ = placed(tiny, pool, None, beside + everything)
    assert whole.whole and whole.cache_bytes == everything
    staging = prompt.staging_bytes(pool, g.n_layer)
    part, _ = placed(tiny, pool, None, beside + everything - 1)  # one byte short: the staging's room is kept
    assert not part.whole and part.cache_bytes <= everything - 1 - staging
    assert part.cache_slots == expert_cache.slots_for(pool, g.n_layer, everything - 1 - staging)
    nothing, _ = placed(tiny, pool, None, beside)
    assert nothing.cache_slots == [0] * g.n_layer and nothing.cache_bytes == 0


def test_the_staging_is_placed_only_beside_the_smallest_session_with_the_smallest_chunk(tiny, pool):  # noqa: F811
    g = tiny.geometry
    _, plan = placed(tiny, pool, 0, 1 << 40)
    smallest = plan.vram_total - plan.vram["dense weights"]
    chunked = smallest + prompt_scratch_bytes(g, prompt.MIN_CHUNK, kv_page_tokens(), DEFAULT_KV)
    staging = prompt.staging_bytes(pool, g.n_layer)
    fits, _ = placed(tiny, pool, 0, chunked + staging)
    assert fits.staged and fits.staging_bytes == staging and fits.cache_slots == [0] * g.n_layer
    short, _ = placed(tiny, pool, 0, chunked + staging - 1)
    assert short.wants_staging and not short.staged and short.staging_free == chunked + staging - 1
