"""Whether waiting decode steps run as one batch or one at a time: from what each cost when it ran.

A batched step reads the dense weights once for its rows, but it is not free per row (docs/performance.md,
"Batched sessions": with every expert in VRAM a batch of 2 already beats two steps; with the experts on the CPU a
batch of 8 barely ties eight). So the batcher asks this policy for each group of n waiting steps: it keeps the
moving average of a lone step's seconds and of a batch of each size's, and batches where a batch of n has cost
less than n lone steps. A size never measured is tried once (a probe); a size that lost is tried again after
REPROBE_AFTER decisions, since costs move with the context and the expert cache.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

# The weight of each new measurement in the moving averages: a few steps settle it, one noisy step does not.
SMOOTHING = 0.2
# Decisions against batching a size after which it is tried again.
REPROBE_AFTER = 256


@dataclass
class _Costs:
    lone: float | None = None                                 # seconds of one step alone
    batch: dict[int, float] = field(default_factory=dict)     # seconds of a batch, by its rows
    declined: dict[int, int] = field(default_factory=dict)    # decisions against each size since it last ran


class BatchPolicy:
    """Per batch key (engines of one model and session shape), the costs seen and the choice they give."""

    def __init__(self) -> None:
        self._costs: dict[Hashable, _Costs] = {}

    def batches(self, key: Hashable, rows: int) -> bool:
        """Whether `rows` (>= 2) waiting steps of engines with `key` should run as one batch."""
        costs = self._costs.setdefault(key, _Costs())
        batch = costs.batch.get(rows)
        if costs.lone is None or batch is None:
            return True  # nothing to weigh yet: measure the batch (the lone steps measure themselves)
        if batch < rows * costs.lone:
            costs.declined[rows] = 0
            return True
        declined = costs.declined.get(rows, 0) + 1
        costs.declined[rows] = 0 if declined >= REPROBE_AFTER else declined
        return declined >= REPROBE_AFTER

    def record(self, key: Hashable, rows: int, seconds: float) -> None:
        """What a step of `rows` rows (1: a lone step) of engines with `key` took."""
        costs = self._costs.setdefault(key, _Costs())
        if rows == 1:
            costs.lone = _averaged(costs.lone, seconds)
        else:
            costs.batch[rows] = _averaged(costs.batch.get(rows), seconds)

    def costs(self, key: Hashable) -> dict[str, object]:
        """The averages kept for `key`: {"lone": seconds or None, "batch": {rows: seconds}}."""
        costs = self._costs.get(key, _Costs())
        return {"lone": costs.lone, "batch": dict(costs.batch)}


def _averaged(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
