"""The VRAM expert cache from Python: its budget, how many of each layer's experts it holds, and filling it.

A budget is "auto" (the free VRAM after the dense weights, the default session and a reserve), a byte count
(an int, or a string such as "24G" or "512M"), or 0 (every routed expert on the CPU pool). Every MoE layer gets
the same number of slots, as many as the budget holds; bytes left over give the first layers one slot more. A
budget that holds every expert makes every layer run on the GPU alone. The experts a partial cache starts with
are each layer's lowest ids; its policy then says whether routing replaces them: "lfru" (the default) admits an
expert that missed three times within 16 tokens into the least recently used slot, at most one copy per partly cached
layer and token, "static" never replaces (docs/expert_cache.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from strata.errors import InvalidArgument
from strata.models import Geometry, Role
from strata.runtime.plan import GIB, Tensors, bytes_by_layer

Budget = str | int

# lfru's admission: 3 misses within 16 tokens. On the locality trace (benchmarks/bench_expert_policy.py) it keeps
# 62-75 % hits where 2 within 32 keeps 66-80 %, and under uniform routing it copies 4-7 experts per token instead
# of 16, which the CPU pool pays for in host reads (docs/expert_cache.md).
POLICIES = {"lfru": {"replace": True, "admit_after": 3, "window": 16}, "static": {"replace": False}}
# A tiered load's (docs/tiers.md) cache: its experts are read through the pool (from its arena or the file) once,
# at load, each layer's highest ids, where the arena starts with the lowest; no replacement copies from the file.
TIERED_POLICY = "static"
RESERVE_BYTES = 1 * GIB  # VRAM "auto" leaves free beyond the plan: graphs, the driver's pools, other allocations
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_budget(budget: Budget, what: str = "expert_cache") -> int | None:
    """Bytes of `budget`, or None for "auto". Strings take a binary unit: "24G" = 24 GiB, "512M", "0". `what`
    names the option in a refusal."""
    if isinstance(budget, bool):
        raise InvalidArgument(f"{what} must be 'auto', a byte count or a size such as '24G', got {budget!r}")
    if isinstance(budget, int):
        if budget < 0:
            raise InvalidArgument(f"{what} must be >= 0 bytes, got {budget}")
        return budget
    if isinstance(budget, str):
        text = budget.strip().upper()
        if text == "AUTO":
            return None
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", text)
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    raise InvalidArgument(f"{what} must be 'auto', a byte count or a size such as '24G', got {budget!r}")


def expert_bytes(g: Geometry, tensors: Tensors) -> list[int]:
    """Canonical bytes of one routed expert (gate, up and down, every plane) of each layer; 0 for a layer
    without routed experts."""
    by_layer = bytes_by_layer(g, tensors)
    return [by_layer[layer][Role.ROUTED_EXPERT] // g.n_expert for layer in range(g.n_layer)]


def cache_bytes(pool, slots: list[int]) -> int:
    """VRAM the native cache of `slots` per layer over `pool` (a strata.runtime.pool.ExpertPool with every layer
    registered) allocates: the native figure, maps and plane alignment included."""
    from strata import _native

    return _native.ExpertCache.bytes_for(pool.native, list(slots))


def moe_layers(pool, n_layer: int) -> list[int]:
    """The layers of `pool` that hold routed experts."""
    return [layer for layer in range(n_layer) if pool.n_expert(layer)]


def holds_every_expert(pool, slots: list[int]) -> bool:
    """Whether `slots` per layer hold every routed expert of every layer of `pool` that has them."""
    return slots == [pool.n_expert(layer) for layer in range(len(slots))]


def slots_for(pool, n_layer: int, budget: int) -> list[int]:
    """Slots per layer of `n_layer` for `budget` bytes of a cache over `pool`: the same count for every MoE layer,
    then one slot more for each of the first layers while the budget holds it; never more than a layer's n_expert
    and never over the budget (by the native cache's own figure, cache_bytes)."""
    moe = moe_layers(pool, n_layer)
    slots = [0] * n_layer
    if not moe:
        return slots
    n_expert = min(pool.n_expert(layer) for layer in moe)

    def cost(count: int, layer: int) -> int:  # what a layer of `count` slots takes (cache_bytes, one layer)
        return cache_bytes(pool, [0] * layer + [count]) if count else 0

    def even_cost(count: int) -> int:
        return sum(cost(count, layer) for layer in moe)

    lo, hi = 0, n_expert  # the most slots every MoE layer can have: a layer's bytes grow with its slots
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if even_cost(mid) <= budget else (lo, mid - 1)
    even = lo
    left = budget - even_cost(even)
    for layer in moe:
        slots[layer] = even
    if even == n_expert:
        return slots
    for layer in moe:
        grow = cost(even + 1, layer) - cost(even, layer)
        if grow <= left:
            slots[layer] += 1
            left -= grow
    return slots


def describe(g: Geometry, tensors: Tensors, slots: list[int], nbytes: int) -> str:
    """One line: how much of the routed experts the cache of `slots` holds, and its `nbytes` (cache_bytes)."""
    held = sum(slots)
    total = g.n_expert * sum(1 for b in expert_bytes(g, tensors) if b)
    share = held / total if total else 0.0
    return f"expert cache: {held} of {total} routed experts in VRAM ({share:.0%}), {nbytes / GIB:.2f} GiB"


def policy_options(policy: str) -> dict:
    """The native replacement options of a policy name (POLICIES)."""
    if policy not in POLICIES:
        raise InvalidArgument(f"expert cache policy {policy!r} is not one of {', '.join(POLICIES)}")
    return POLICIES[policy]


def build(pool, slots: list[int], device: int, sizes: list[int], progress: Callable[[int, int], None] | None = None,
          policy: str = "lfru"):
    """The native cache (strata._native.ExpertCache) of `slots` per layer over `pool` (a strata.runtime.pool
    ExpertPool with every layer registered), each layer holding its lowest `slots[l]` ids (a tiered layer its
    highest: its arena holds the lowest) and replacing them by `policy`; None when it holds nothing. `sizes`: bytes
    of one expert per layer (expert_bytes), for `progress(bytes done, bytes)`."""
    from strata import _native

    options = dict(policy_options(policy))
    if not any(slots):
        return None
    if options["replace"]:  # the copy budget: one expert per partly cached layer and token
        options["max_copies"] = max(1, sum(1 for layer, s in enumerate(slots) if 0 < s < pool.n_expert(layer)))
    cache = _native.ExpertCache(pool.native, slots, device, options, host_weights=pool.host_weights())
    total = sum(s * b for s, b in zip(slots, sizes))
    done = 0
    for layer, count in enumerate(slots):
        if count:
            n = pool.n_expert(layer)
            cache.hold(layer, range(n - count, n) if pool.is_tiered(layer) else range(count))
            done += count * sizes[layer]
            if progress:
                progress(done, total)
    return cache
