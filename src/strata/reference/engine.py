"""The numpy reference as a generation engine: slow, exact, for tiny models and for checking the GPU
engine token by token. It samples its logits with strata.sampling, the definition the GPU sampler follows."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from strata.errors import InvalidArgument
from strata.reference.model import Reference
from strata.sampling import SamplingParams, log_probabilities, sample

SNAPSHOTS = 4  # states kept for a session's prefix reuse (each a full copy: the reference runs tiny models)


class ReferenceEngine:
    """strata.generation.Engine over strata.reference.Reference, with state snapshots and logprobs."""

    def __init__(self, reference: Reference, context: int | None = None, snapshots: int = SNAPSHOTS):
        self.reference = reference
        self.context = context or reference.geometry.context_length
        self.snapshots = snapshots
        self._saved: dict[int, tuple[int, list]] = {}
        self._logits: np.ndarray | None = None

    @property
    def position(self) -> int:
        return self.reference.n_past

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        self._logits = self.reference.forward(list(ids))[-1]
        return sample(self._logits, params, u, seen)

    def score(self, ids: Sequence[int], seen: Sequence[int]) -> np.ndarray:
        """Append `ids` to the sequence and return float32 [len(ids), n_vocab]: row i the logits after ids[i], as
        the GPU engine's score. Nothing is sampled."""
        logits = np.asarray(self.reference.forward(list(ids)), dtype=np.float32)
        self._logits = logits[-1]
        return logits

    def prefill(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        """Append `ids` to the sequence; no token is sampled."""
        self._logits = self.reference.forward(list(ids))[-1]

    def logprobs(self, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
        if self._logits is None:
            raise InvalidArgument("logprobs come after a feed")
        return log_probabilities(self._logits, token, n)

    def snapshot(self, slot: int) -> None:
        """Keep the state after the tokens fed so far in `slot` (0 .. snapshots - 1)."""
        self._check(slot)
        self._saved[slot] = (self.reference.n_past, copy.deepcopy(self.reference.state))

    def restore(self, slot: int) -> None:
        """Back to the state kept in `slot`."""
        self._check(slot)
        if slot not in self._saved:
            raise InvalidArgument(f"snapshot slot {slot} holds no state")
        n_past, state = self._saved[slot]
        self.reference.n_past, self.reference.state = n_past, copy.deepcopy(state)
        self._logits = None

    def reset(self) -> None:
        self.reference.reset()
        self._logits = None

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.snapshots:
            raise InvalidArgument(f"snapshot slot {slot} is outside 0..{self.snapshots - 1}")
