"""The expert cache's plan on the CPU: budgets, slots per layer, the bytes the plan counts against what the native
cache allocates and the pool holds, and the command-line options that set it. The cache on the GPU is
tests/session/test_decode_session.py's."""

from __future__ import annotations

import argparse

import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.runtime import expert_cache
from strata.runtime.loader import load_experts
from strata.runtime.plan import file_tensors, memory_plan
from strata.runtime.pool import ExpertPool
from strata.synth import synthesize

GIB = 1 << 30
# Float and quantized experts with different planes (Q4_K: codes, d, sub-scales, mins, sub-mins; Q4_0: codes, d).
TYPES = {"qwen4exp": {"experts": "q4_k", "expert_down": "q4_0"}, "qwen3next": {"experts": "bf16"},
         "qwen35moe": {"experts": "q8_0", "expert_down": "f16"}}


@pytest.fixture(scope="module", params=sorted(TYPES))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("cache") / f"{request.param}.gguf"
    synthesize(path, request.param, types=TYPES[request.param], seed=5)
    with inspect(path) as file:
        yield file


@pytest.fixture(scope="module")
def pool(tiny):
    g = tiny.geometry
    with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, threads=1, pin_caller=False) as pool:
        load_experts(tiny, pool)
        yield pool


@pytest.mark.parametrize(("text", "bytes_"), [("auto", None), ("AUTO", None), (0, 0), ("0", 0), (12345, 12345),
                                              ("24G", 24 * GIB), ("512M", 512 << 20), ("1.5G", 3 * GIB // 2),
                                              ("16GiB", 16 * GIB), ("2t", 2 << 40), ("100k", 100 << 10)],
                         ids=repr)
def test_budgets_parse(text, bytes_):
    assert expert_cache.parse_budget(text) == bytes_


@pytest.mark.parametrize("bad", ["lots", "-1G", "1.2.3G", "", "12X", -1, True, 1.5, None], ids=repr)
def test_a_bad_budget_is_refused_with_what_is_accepted(bad):
    with pytest.raises(InvalidArgument, match="'auto', a byte count or a size such as '24G'|must be >= 0"):
        expert_cache.parse_budget(bad)


def test_expert_bytes_are_what_the_pool_holds(tiny, pool):
    per_expert = expert_cache.expert_bytes(tiny.geometry, file_tensors(tiny))
    assert per_expert == [pool.layer_bytes(layer) for layer in range(tiny.geometry.n_layer)]


def test_the_plan_counts_what_the_native_cache_allocates(tiny, pool, rng):
    g, tensors = tiny.geometry, file_tensors(tiny)
    per_expert = expert_cache.expert_bytes(g, tensors)
    for _ in range(6):
        slots = [int(s) for s in rng.integers(0, g.n_expert + 1, g.n_layer)]
        native = _native.ExpertCache.bytes_for(pool.native, slots)
        planned = expert_cache.cache_bytes(pool, slots)
        assert sum(s * b for s, b in zip(slots, per_expert)) <= native == planned, slots
        # per layer: the layers' figures add up to the whole cache's (slots_for prices one layer at a time)
        assert sum(expert_cache.cache_bytes(pool, [0] * layer + [s]) for layer, s in enumerate(slots)) == planned


def test_slots_fill_the_budget_evenly_and_never_pass_it(tiny, pool):
    g = tiny.geometry
    everything = expert_cache.cache_bytes(pool, [g.n_expert] * g.n_layer)
    assert expert_cache.slots_for(pool, g.n_layer, everything) == [g.n_expert] * g.n_layer
    assert expert_cache.slots_for(pool, g.n_layer, 10 * everything) == [g.n_expert] * g.n_layer
    assert expert_cache.slots_for(pool, g.n_layer, 0) == [0] * g.n_layer
    assert expert_cache.holds_every_expert(pool, [g.n_expert] * g.n_layer)
    assert not expert_cache.holds_every_expert(pool, [g.n_expert] * (g.n_layer - 1) + [g.n_expert - 1])
    previous = [0] * g.n_layer
    for budget in range(0, everything + 1, max(1, everything // 97)):
        slots = expert_cache.slots_for(pool, g.n_layer, budget)
        assert expert_cache.cache_bytes(pool, slots) <= budget, (budget, slots)
        assert max(slots) - min(slots) <= 1 and slots == sorted(slots, reverse=True), (budget, slots)
        assert all(a >= b for a, b in zip(slots, previous)), (budget, slots, previous)  # more budget, never fewer
        # no slot more would fit: what is left is less than one expert of the next layer to get one
        if min(slots) < g.n_expert:
            grown = list(slots)
            grown[grown.index(min(grown))] += 1
            assert expert_cache.cache_bytes(pool, grown) > budget, (budget, slots)
        previous = slots


def test_the_memory_plan_counts_the_cache(tiny):
    g, tensors = tiny.geometry, file_tensors(tiny)
    without = memory_plan(g, tensors, 64)
    with_cache = memory_plan(g, tensors, 64, expert_cache=12345)
    assert "expert cache" not in without.vram and with_cache.vram["expert cache"] == 12345
    assert with_cache.vram_total == without.vram_total + 12345
    assert any(line.strip().startswith("expert cache") for line in with_cache.lines())


def test_describe_says_how_much_is_held(tiny):
    g, tensors = tiny.geometry, file_tensors(tiny)
    line = expert_cache.describe(g, tensors, [g.n_expert // 2] * g.n_layer, 3 << 29)
    assert f"{g.n_expert // 2 * g.n_layer} of {g.n_expert * g.n_layer} routed experts in VRAM (50%)" in line
    assert line.endswith(", 1.50 GiB")


def test_the_command_line_passes_the_placement_to_load():
    from strata.cli.session import add_engine_arguments, placement

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["m.gguf", "--expert-cache", "8G", "--vram-limit", "24G", "--cache-policy", "static",
                              "--ram-budget", "16G"])
    assert placement(args) == {"progress": True, "expert_cache": "8G", "cache_policy": "static", "vram_limit": "24G",
                               "ram_budget": "16G"}
    assert placement(parser.parse_args(["m.gguf"])) == {"progress": True, "expert_cache": "auto",
                                                        "cache_policy": "lfru", "vram_limit": None,
                                                        "ram_budget": "auto"}
