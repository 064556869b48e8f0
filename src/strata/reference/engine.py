"""The numpy reference as a generation engine: slow, exact, for tiny models and for checking the GPU
engine token by token. It samples its logits with strata.sampling, the definition the GPU sampler follows."""

from __future__ import annotations

from collections.abc import Sequence

from strata.reference.model import Reference
from strata.sampling import SamplingParams, sample


class ReferenceEngine:
    """strata.generation.Engine over strata.reference.Reference."""

    def __init__(self, reference: Reference, context: int | None = None):
        self.reference = reference
        self.context = context or reference.geometry.context_length

    @property
    def position(self) -> int:
        return self.reference.n_past

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        logits = self.reference.forward(list(ids))[-1]
        return sample(logits, params, u, seen)

    def reset(self) -> None:
        self.reference.reset()
