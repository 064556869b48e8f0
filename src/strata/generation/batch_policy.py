"""How waiting decode steps run: as batches of which sizes, or one at a time; from what each cost when it ran.

A batched step reads the dense weights once for its rows, but it is not free per row (docs/performance.md,
"Batched sessions": with every expert in VRAM a batch of 2 already beats two steps; with the experts on the CPU a
batch of 8 barely ties eight). So the batcher asks this policy, for each group of n waiting steps of one batch key,
for a plan: the sizes of the engine calls that step them (1: a lone step). The policy keeps the moving average of
a lone step's seconds and of a batch of each size's, and plans the split of n into sizes it has measured (a lone
step among them) that costs least in all: taking turns (n lone steps) is one of the splits it weighs, so a batch
that costs more than its steps alone is not taken, and a size that wins is, also inside a larger group whose own
size loses. What it has not measured it measures once (a probe): the lone step first (one step alone, the rest as
one batch), then the group's size; a size left out of the plans is tried again after REPROBE_AFTER plans, and so is
the lone step after as many plans without one, since costs move with the context and the expert cache. Probes are
the only plans that may cost more than taking turns: at most one per size and key every REPROBE_AFTER plans.

`gathers(key)` says whether the batcher should wait for a key's other members before stepping (a batch pays, or
is still to be measured): where every plan steps alone, waiting for the others would only delay them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

# The weight of each new measurement in the moving averages: a few steps settle it, one noisy step does not.
SMOOTHING = 0.2
# Plans after which a size left out of them, or the lone step, is measured again.
REPROBE_AFTER = 256


@dataclass
class _Costs:
    lone: float | None = None                                 # seconds of one step alone
    batch: dict[int, float] = field(default_factory=dict)     # seconds of a batch, by its rows
    declined: dict[int, int] = field(default_factory=dict)    # plans that left each size out since it last ran
    without_lone: int = 0                                      # plans since the lone step last ran
    gathers: bool = True                                       # the last plan batched or probed


def chunks(rows: int, size: int) -> list[int]:
    """`rows` split into engine calls of `size` rows, the last one shorter where they do not divide."""
    return [size] * (rows // size) + ([rows % size] if rows % size else [])


class BatchPolicy:
    """Per batch key (engines of one model and session shape), the costs seen and the plans they give."""

    def __init__(self) -> None:
        self._costs: dict[Hashable, _Costs] = {}

    def plan(self, key: Hashable, rows: int, limit: int | None = None) -> list[int]:
        """The sizes of the engine calls that step `rows` waiting steps of engines with `key`, in order (1: a lone
        step; each at most `limit`, None: no limit); they add up to `rows`."""
        if rows < 1:
            return []
        limit = rows if limit is None else max(1, min(limit, rows))
        if limit == 1:
            return [1] * rows
        costs = self._costs.setdefault(key, _Costs())
        costs.without_lone += 1
        if costs.lone is None or costs.without_lone >= REPROBE_AFTER:
            return self._probed(costs, [1, *chunks(rows - 1, limit)])  # (the lone step resets without_lone)
        full = chunks(rows, limit)
        if any(size > 1 and size not in costs.batch for size in full):
            return self._probed(costs, full)
        best = self._cheapest(costs, rows, limit)
        if best != full:
            declined = costs.declined.get(limit, 0) + 1
            costs.declined[limit] = declined
            if declined >= REPROBE_AFTER:
                return self._probed(costs, full)
        costs.gathers = any(size > 1 for size in best)
        return best

    def record(self, key: Hashable, rows: int, seconds: float) -> None:
        """What a step of `rows` rows (1: a lone step) of engines with `key` took."""
        costs = self._costs.setdefault(key, _Costs())
        if rows == 1:
            costs.lone = _averaged(costs.lone, seconds)
            costs.without_lone = 0
        else:
            costs.batch[rows] = _averaged(costs.batch.get(rows), seconds)
            costs.declined[rows] = 0

    def gathers(self, key: Hashable) -> bool:
        """Whether steps of `key` are worth gathering: its last plan batched or measured (or none was made)."""
        costs = self._costs.get(key)
        return costs is None or costs.gathers

    def costs(self, key: Hashable) -> dict[str, object]:
        """The averages kept for `key`: {"lone": seconds or None, "batch": {rows: seconds}}."""
        costs = self._costs.get(key, _Costs())
        return {"lone": costs.lone, "batch": dict(costs.batch)}

    @staticmethod
    def _probed(costs: _Costs, plan: list[int]) -> list[int]:
        costs.gathers = True
        return plan

    @staticmethod
    def _cheapest(costs: _Costs, rows: int, limit: int) -> list[int]:
        """The split of `rows` into measured sizes of at most `limit` (the lone step among them) that costs least
        by the averages; of equal costs, the one of fewer engine calls."""
        sizes = {1: costs.lone, **{k: c for k, c in costs.batch.items() if k <= limit}}
        best: list[tuple[float, int, int]] = [(0.0, 0, 0)]  # for each n: (cost, calls, the last call's size)
        for n in range(1, rows + 1):
            best.append(min((best[n - k][0] + cost, best[n - k][1] + 1, k) for k, cost in sizes.items() if k <= n))
        plan, n = [], rows
        while n:
            plan.append(best[n][2])
            n -= best[n][2]
        return sorted(plan, reverse=True)


def _averaged(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
