"""Where a load puts the routed experts beside the dense weights, decided once and then carried out: how many of
each layer's experts the VRAM cache holds (strata.runtime.expert_cache) and whether the prompt path's staging
(strata.runtime.prompt) fits beside it. Every byte count is the native cache's or staging's own figure over the
pool that holds the experts, so the decision and the allocations cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import OutOfMemory
from strata.generation import session_context
from strata.models import Geometry
from strata.options import DEFAULT_KV
from strata.runtime import expert_cache as cache_plan
from strata.runtime import prompt as prompt_plan
from strata.runtime.plan import GIB, MemoryPlan, Tensors, kv_page_tokens, memory_plan, prompt_scratch_bytes


@dataclass(frozen=True)
class ExpertPlacement:
    cache_slots: list[int]  # experts of each layer the VRAM cache holds (0: none of the layer's)
    cache_bytes: int        # what the cache of cache_slots allocates
    whole: bool             # the cache holds every routed expert: no layer rings, prompts need no staging
    staging_bytes: int      # what the prompt path's staging needs (0: no prompt path asked, or the cache is whole)
    staging_free: int       # VRAM free for the staging beside the dense weights and the cache
    staged: bool            # the staging fits beside them and the smallest session with the smallest chunk

    @property
    def wants_staging(self) -> bool:
        return self.staging_bytes > 0


def place_experts(g: Geometry, tensors: Tensors, plan: MemoryPlan, pool, budget: int | None, free: int, device: int,
                  prompt: bool) -> ExpertPlacement:
    """The placement of `pool`'s routed experts for a model whose `plan` (with the smallest session) is in place
    but for its routed experts, with `free` bytes of VRAM left on GPU `device` beside its dense weights.

    The cache's `budget` (bytes; None: "auto") becomes its slots: "auto" leaves room for the default session (with
    its prompt chunk), the prompt path's staging (with `prompt`) unless the cache can hold every expert, and a
    reserve; an explicit budget must leave room for the smallest session. With `prompt`, the staging of a whole layer per buffer is
    placed where it fits beside the cache and the smallest session with the smallest chunk."""
    dense = plan.vram["dense weights"]
    smallest = plan.vram_total - dense
    everything = cache_plan.cache_bytes(pool, [pool.n_expert(layer) for layer in range(g.n_layer)])
    staging = prompt_plan.staging_bytes(pool, g.n_layer) if prompt else 0
    if budget is None:
        context = session_context(None, g.context_length)
        chunk = min(prompt_plan.DEFAULT_CHUNK, context)
        session = memory_plan(g, tensors, context, DEFAULT_KV, prompt_chunk=chunk).vram_total - dense
        room = free - session - cache_plan.RESERVE_BYTES
        budget = everything if room >= everything else max(0, room - staging)
    else:
        budget = min(budget, everything)
        if budget > free - smallest:
            raise OutOfMemory(f"expert_cache of {budget / GIB:.2f} GiB does not fit: GPU {device} has "
                              f"{free / GIB:.2f} GiB free for the model after its dense weights and the smallest "
                              f"session needs {smallest / GIB:.2f} GiB; at most {max(0, free - smallest) / GIB:.2f} "
                              "GiB fits (or expert_cache='auto')")
    slots = cache_plan.slots_for(pool, g.n_layer, budget)
    cached = cache_plan.cache_bytes(pool, slots)
    whole = cache_plan.holds_every_expert(pool, slots)
    if not prompt or whole:
        return ExpertPlacement(slots, cached, whole, 0, free - cached, False)
    chunked = smallest + prompt_scratch_bytes(g, prompt_plan.MIN_CHUNK, kv_page_tokens(), DEFAULT_KV)
    return ExpertPlacement(slots, cached, whole, staging, free - cached, staging <= free - cached - chunked)
