"""The RAM budget and the disk tier from a model file (strata.runtime.tiers, docs/tiers.md): the plan's split
of the routed experts, its refusals with the figures, the loader reading only what the plan keeps in RAM, and the
plan's bytes being the pool's allocations."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from strata.errors import FormatError, OutOfMemory
from strata.format import inspect
from strata.models import Role
from strata.runtime.expert_cache import expert_bytes
from strata.runtime.loader import load_experts
from strata.runtime.plan import GIB, bytes_by_role, file_tensors, memory_plan, pinned_bytes
from strata.runtime.pool import ExpertPool
from strata.runtime.tiers import (
    RamBudget, arena_slots, expert_file_bytes, plan_ram, ram_budget, share_budget, spare_ram,
)
from strata.synth import synthesize

pytest.importorskip("strata._native")

# Experts larger than the dense part, as in the models the tier is for (a budget never goes below the dense part).
TYPES = {"experts": "q5_k", "expert_down": "q8_0", "dense": "q4_0", "embeddings": "q4_0", "ple": "q8_0"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiers") / "tiny.gguf"
    return synthesize(path, "qwen3next", "tiny", types=TYPES, seed=3)


def parts(path: Path) -> tuple[int, int, int]:
    """(dense bytes, routed experts' bytes, pinned buffers) of the file's plan."""
    with inspect(path) as file:
        roles = bytes_by_role(file.geometry, file_tensors(file))
        dense = roles[Role.DENSE] + roles[Role.ELEMENTWISE] + roles[Role.ROW_GATHERED]
        return dense, roles[Role.ROUTED_EXPERT], pinned_bytes(file.geometry)


def test_a_budget_that_holds_every_expert_keeps_them_all_in_ram(model):
    dense, experts, pinned = parts(model)
    with inspect(model) as file:
        plan = plan_ram(file, RamBudget(max(dense, experts + pinned), "test"))
    assert not plan.tiered and plan.tier_bytes is None and plan.expert_ram == experts and plan.on_disk == 0
    assert all(s == file.geometry.n_expert for s in plan.slots)
    assert "all in host RAM" in "\n".join(plan.lines())


@pytest.mark.parametrize("share", [0.0, 0.3, 0.6])
def test_a_smaller_budget_tiers_every_layer_within_it(model, share):
    dense, experts, pinned = parts(model)
    with inspect(model) as file:
        g = file.geometry
        probe = plan_ram(file, RamBudget(max(dense, pinned + 1), "probe"))  # the staging's figure
        budget = max(dense, pinned + probe.staging + int(share * experts * 1.2))
        if budget >= experts + pinned:
            pytest.skip("the dense part holds every expert at this share")
        plan = plan_ram(file, RamBudget(budget, "test"))
    assert plan.tiered and sorted(plan.matrices) == list(range(g.n_layer))
    assert plan.expert_ram + plan.staging + pinned <= budget
    held = sum(plan.slots)
    assert max(plan.slots) - min(plan.slots) <= 1 and plan.slots == tuple(sorted(plan.slots, reverse=True))
    per_expert = expert_file_bytes(plan.matrices[0])
    assert plan.on_disk == (g.n_expert * g.n_layer - held) * per_expert
    lines = "\n".join(plan.lines())
    assert f"{held} of {g.n_expert * g.n_layer}" in lines and "on disk" in lines and "staging" in lines
    memory = memory_plan(g, file_tensors(file), 256, tiers=plan.tier_bytes)
    assert memory.host["routed experts"] == plan.expert_ram and memory.host["disk tier staging"] == plan.staging
    assert memory.disk == {"routed experts": plan.on_disk}
    assert any(line.startswith("disk  routed experts") for line in memory.lines())


def test_a_budget_below_the_dense_part_is_refused_with_the_figures(model):
    dense, _, _ = parts(model)
    with inspect(model) as file, pytest.raises(OutOfMemory, match=r"below the dense part's \d+\.\d\d MiB"):
        plan_ram(file, RamBudget(dense - 1, "ram_budget"))


def test_a_budget_without_room_for_the_staging_is_refused(model, monkeypatch):
    dense, experts, pinned = parts(model)
    import strata.runtime.tiers as tiers

    monkeypatch.setattr(tiers, "pinned_bytes", lambda g: dense + 1)  # the dense part fits, nothing else does
    with inspect(model) as file, pytest.raises(OutOfMemory, match="holds not even the disk tier's staging"):
        plan_ram(file, RamBudget(dense + 2, "ram_budget"))


def test_types_the_tier_does_not_read_are_refused_beyond_the_budget(model, monkeypatch):
    """The lattice i-quants (which synth does not write: the tier's type list stands in for them here)."""
    import strata.runtime.tiers as tiers

    dense, experts, pinned = parts(model)
    monkeypatch.setattr(tiers, "tier_types", lambda: frozenset())
    with inspect(model) as file:
        with pytest.raises(OutOfMemory, match="does not read q5_k, q8_0 experts yet"):
            plan_ram(file, RamBudget(max(dense, experts // 2), "ram_budget"))
        assert not plan_ram(file, RamBudget(max(dense, experts + pinned), "test")).tiered


def test_the_default_budget_is_what_the_machine_spares(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 33554432 kB\nMemAvailable: 25165824 kB\n")  # 32 GiB, 24 available
    spare = spare_ram(proc)
    assert spare.nbytes == 22 * GIB and "24.00 GiB available less a reserve of 2.00 GiB" in spare.source
    assert ram_budget(None, proc) == spare
    assert ram_budget(8 * GIB, proc) == RamBudget(8 * GIB, "ram_budget")
    with pytest.raises(OutOfMemory, match="ram_budget 30.00 GiB is more than the 24.00 GiB"):
        ram_budget(30 * GIB, proc)


def test_arena_slots_share_the_room_as_the_vram_cache_does():
    assert arena_slots([10, 10, 10], 8, 105) == [4, 3, 3]
    assert arena_slots([10, 10, 10], 8, 95) == [3, 3, 3]
    assert arena_slots([10, 20], 8, 10_000) == [8, 8]
    assert arena_slots([10, 10], 8, 5) == [0, 0]
    assert arena_slots([], 8, 100) == []


def run_calls(pool: ExpertPool, g, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    out = []
    for call in range(n):
        layer = call % g.n_layer
        x = rng.standard_normal(g.n_embd).astype(np.float32)
        ids = rng.choice(g.n_expert, g.n_expert_used, replace=False).astype(np.int32)
        weights = rng.dirichlet(np.ones(g.n_expert_used)).astype(np.float32)
        out.append(pool.run_layer_sum(layer, x, ids, weights))
    return out


@pytest.mark.parametrize("share", [0.0, 0.3])
def test_the_loader_reads_only_what_the_plan_keeps(model, rng, share):
    """A tiered load reads the arenas' experts and nothing else of the experts; the pool holds what the plan said,
    to the byte; its answers are those of the load that keeps every expert in RAM."""
    dense, experts, pinned = parts(model)
    with inspect(model) as file:
        g = file.geometry
        probe = plan_ram(file, RamBudget(max(dense, pinned + 1), "probe"))
        plan = plan_ram(file, RamBudget(max(dense, pinned + probe.staging + int(share * experts)), "test"))
        assert plan.tiered
        seed = int(rng.integers(1 << 31))
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, pin_caller=False) as whole, \
                ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, pin_caller=False) as tiered:
            load_experts(file, whole)
            start = time.monotonic()
            load_experts(file, tiered, None, plan)
            assert time.monotonic() - start < 10
            info = tiered.file_info()
            assert info["arena_bytes"] == plan.expert_ram and info["staging_bytes"] == plan.staging
            read = sum(s["bytes_read"] for s in tiered.tier_stats())
            assert read == sum(plan.slots) * expert_file_bytes(plan.matrices[0])
            want = run_calls(whole, g, np.random.default_rng(seed), 12)
            got = run_calls(tiered, g, np.random.default_rng(seed), 12)
            for call, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), f"call {call}")


def test_a_tiered_layer_takes_the_room_of_its_experts_in_the_vram_cache(model):
    """The VRAM cache sizes a tiered layer's slots from its forms (ExpertPool::layer_forms, no planes): the bytes
    of the same experts all in RAM, to the byte; and an expert read through the tier fills what its slot takes."""
    from strata import _native

    dense, experts, pinned = parts(model)
    with inspect(model) as file:
        g = file.geometry
        probe = plan_ram(file, RamBudget(max(dense, pinned + 1), "probe"))
        plan = plan_ram(file, RamBudget(max(dense, pinned + probe.staging + int(0.3 * experts)), "test"))
        assert plan.tiered
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, pin_caller=False) as whole, \
                ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, pin_caller=False) as tiered:
            load_experts(file, whole)
            load_experts(file, tiered, None, plan)
            one = [1] * g.n_layer
            for slots in (one, [3] * g.n_layer, [g.n_expert] * g.n_layer, [0] + [2] * (g.n_layer - 1)):
                assert (_native.ExpertCache.bytes_for(tiered.native, slots)
                        == _native.ExpertCache.bytes_for(whole.native, slots)), slots
            expert = g.n_expert - 1  # beyond the arena's first experts: read from the file
            got = tiered.read_expert(0, expert)
            np.testing.assert_array_equal(got, whole.read_expert(0, expert))


def test_a_file_truncated_after_the_plan_fails_the_load(tmp_path, rng):
    path = synthesize(tmp_path / "short.gguf", "qwen3next", "tiny", types=TYPES, seed=4)
    dense, experts, pinned = parts(path)
    with inspect(path) as file:
        g = file.geometry
        probe = plan_ram(file, RamBudget(max(dense, pinned + 1), "probe"))
        plan = plan_ram(file, RamBudget(max(dense, pinned + probe.staging + experts // 2), "test"))
        last = plan.matrices[g.n_layer - 1][2]
        with open(path, "r+b") as out:
            out.truncate(last.offset + last.stride // 2)
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, pin_caller=False) as pool:
            with pytest.raises(FormatError, match=rf"short\.gguf: layer {g.n_layer - 1} expert 0 down at bytes"):
                load_experts(file, pool, None, plan)


def test_a_share_of_the_experts_is_a_budget_that_holds_it(model):
    with inspect(model) as file:
        g = file.geometry
        budget = share_budget(file, 0.5)
        assert budget.source == "50% of the routed experts"
        assert plan_ram(file, budget).slots == (g.n_expert // 2,) * g.n_layer
        assert not plan_ram(file, share_budget(file, 1.0)).tiered


def test_info_shows_where_the_model_lands(model):
    from strata.cli.info import tier_lines

    dense, experts, _ = parts(model)
    with inspect(model) as file:
        tiered = "\n".join(tier_lines(file, str(dense + experts // 3)))
        whole = "\n".join(tier_lines(file, str(10 * (dense + experts))))
        refused = "\n".join(tier_lines(file, "1K"))
    assert "VRAM: dense weights" in tiered and "in pinned RAM" in tiered and "on disk" in tiered
    assert "all in host RAM" in whole and "on disk" not in whole
    assert "cannot load: RAM budget 0.00 MiB (ram_budget) is below the dense part's" in refused


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3next", "qwen4exp"])
def test_a_tiered_load_decodes_what_a_whole_load_decodes(tmp_path, arch):
    """On the GPU, end to end: the same greedy tokens with every routed expert in RAM and with a third
    of them in the pool's arena (the rest read from the file as decoding routes them); qwen4exp's n-gram rows come
    from the file too. Neither load has a VRAM cache, and the tiered one no prompt staging. Then, with half the
    experts in VRAM (the tiered load's cache reads them through the pool) and a third of them in RAM, the same
    tokens as a whole load whose cache holds the same experts."""
    from strata.runtime.model import load

    # the GPU's embedding gather reads Q8_0 rows (or float): the rest of the mix as the plans' tests take it
    path = synthesize(tmp_path / "m.gguf", arch, "tiny", types=dict(TYPES, embeddings="q8_0"), seed=7)
    with inspect(path) as file:
        budget = share_budget(file, 0.33)
    prompt = list(range(3, 12))
    runs = []
    for options in ({"expert_cache": 0}, {"expert_cache": 0, "ram_budget": budget.nbytes}):
        with load(path, progress=False, **options) as model:
            assert (model.ram.tiered, model.cache) == ("ram_budget" in options, None)
            assert model.staging is None or not model.ram.tiered  # a whole load stages its prompts' experts
            with model.session(context=64, mode="token_graph") as session:
                runs.append([piece.token for piece in session.generate(prompt, max_tokens=24)])
            if model.ram.tiered:
                stats = model.pool.tier_stats()
                assert sum(s["misses"] for s in stats) > 0 and sum(s["hits"] for s in stats) > 0
    assert runs[0] == runs[1]
    with inspect(path) as file:
        g = file.geometry
        half = sum(b * (g.n_expert // 2) for b in expert_bytes(g, file_tensors(file))) + (1 << 20)  # + the maps
    held = []
    for options in ({"cache_policy": "static"}, {"ram_budget": budget.nbytes}):
        # no prompt path: the prompt steps as decode does, so both loads run every expert on the same side
        with load(path, progress=False, expert_cache=half, prompt=False, **options) as model:
            slots = [model.cache.slots(layer) for layer in range(g.n_layer)]
            assert model.ram.tiered == ("ram_budget" in options) and any(slots), slots
            for layer, count in enumerate(slots):  # the whole load's cache holds what the tiered one's does
                if count and not model.ram.tiered:
                    model.cache.hold(layer, range(g.n_expert - count, g.n_expert))
                assert model.cache.held(layer) == list(range(g.n_expert - count, g.n_expert)), layer
            with model.session(context=64, mode="token_graph") as session:
                held.append([piece.token for piece in session.generate(prompt, max_tokens=24)])
    assert held[0] == held[1]
