"""The numpy reference as a generation engine: slow, exact, for tiny models and for checking the GPU
engine token by token. It samples its logits with strata.sampling, the definition the GPU sampler follows."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from strata.errors import InvalidArgument
from strata.reference.model import Reference
from strata.sampling import SamplingParams, TokenMask, log_probabilities, sample

SNAPSHOTS = 4  # states kept for a session's prefix reuse (each a full copy: the reference runs tiny models)
VERIFY_ROWS = 8  # ids one verify takes by default: the pending token and strata's most drafts (7)


class ReferenceEngine:
    """strata.generation.Engine over strata.reference.Reference, with state snapshots, logprobs, and verifies of
    up to `verify_rows` ids (0: none) that truncate rolls back. `reference` may be an MtpReference
    (strata.reference.mtp), whose state holds its MTP block's with the main model's. It samples with
    strata.sampling.sample, which applies every SamplingParams field (`full_sampling`), the token mask included
    (`token_masks`: structured output). `steering` reads control-vector files into a table for
    set_control_vectors: (control_vectors, control_layers) -> {layer: float32 [n_embd]} (None: the engine takes
    none)."""

    full_sampling = True
    token_masks = True

    def __init__(self, reference: Reference, context: int | None = None, snapshots: int = SNAPSHOTS,
                 verify_rows: int = VERIFY_ROWS,
                 steering: Callable[[Sequence, tuple[int, int] | None], Mapping[int, np.ndarray]] | None = None):
        if verify_rows < 0:
            raise InvalidArgument(f"verify_rows must be >= 0 (0: no verify), got {verify_rows}")
        self.reference = reference
        self.context = context or reference.geometry.context_length
        self.snapshots, self.verify_rows = snapshots, verify_rows
        self._steering = steering
        self._saved: dict[int, tuple[int, list]] = {}
        self._logits: np.ndarray | None = None
        # after a verify, until the next call that moves the sequence: its start and the state after each row
        self._verified: tuple[int, list[list]] | None = None

    @property
    def position(self) -> int:
        return self.reference.n_past

    def set_control_vectors(self, control_vectors: Sequence = (), control_layers: tuple[int, int] | None = None
                            ) -> None:
        """The control vectors added from the next token on (an empty list: none); the sequence held keeps its
        state."""
        if self._steering is None:
            raise InvalidArgument("this engine was made without a way to read control vectors "
                                  "(ReferenceModel.session makes one with it)")
        main = getattr(self.reference, "main", self.reference)  # an MtpReference steers its main model
        main.set_control_vectors(self._steering(control_vectors, control_layers))

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        self._verified = None
        self._logits = self.reference.forward(list(ids))[-1]
        return sample(self._logits, params, u, seen)

    def score(self, ids: Sequence[int], seen: Sequence[int]) -> np.ndarray:
        """Append `ids` to the sequence and return float32 [len(ids), n_vocab]: row i the logits after ids[i], as
        the GPU engine's score. Nothing is sampled."""
        self._verified = None
        logits = np.asarray(self.reference.forward(list(ids)), dtype=np.float32)
        self._logits = logits[-1]
        return logits

    def verify(self, ids: Sequence[int], seen: Sequence[int]) -> np.ndarray:
        """Append `ids` token by token (each row exactly what stepping it would give) and return float32
        [len(ids), n_vocab], row i the logits after ids[i]; the state after each row is kept for `truncate`."""
        if not self.verify_rows:
            raise InvalidArgument("this engine was made without verify (verify_rows 0)")
        if not 1 <= len(ids) <= self.verify_rows:
            raise InvalidArgument(f"verify takes 1..{self.verify_rows} ids (verify_rows), got {len(ids)}")
        start, rows, states = self.reference.n_past, [], []
        self._verified = None
        for token in ids:
            rows.append(self.reference.forward([int(token)])[-1])
            states.append(copy.deepcopy(self.reference.state))
        self._verified = (start, states)
        self._logits = rows[-1]
        return np.asarray(rows, dtype=np.float32)

    def truncate(self, position: int) -> None:
        """Back to the state after `position` tokens, within the last verify's rows (see the Engine protocol)."""
        if self._verified is None:
            raise InvalidArgument("truncate comes right after a verify (nothing else may move the sequence between)")
        start, states = self._verified
        if not start + 1 <= position <= start + len(states):
            raise InvalidArgument(f"truncate to {position} is outside the last verify's positions "
                                  f"{start + 1}..{start + len(states)}")
        if position != self.reference.n_past:
            self.reference.n_past, self.reference.state = position, copy.deepcopy(states[position - start - 1])
            self._logits = None  # logprobs are undefined after a truncate

    def prefill(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        """Append `ids` to the sequence; no token is sampled."""
        self._verified = None
        self._logits = self.reference.forward(list(ids))[-1]

    def logprobs(self, token: int, n: int, token_mask: TokenMask | None = None
                 ) -> tuple[float, list[tuple[int, float]]]:
        if self._logits is None:
            raise InvalidArgument("logprobs come after a feed")
        return log_probabilities(self._logits, token, n, token_mask)

    def snapshot(self, slot: int) -> None:
        """Keep the state after the tokens fed so far in `slot` (0 .. snapshots - 1)."""
        self._check(slot)
        self._verified = None
        self._saved[slot] = (self.reference.n_past, copy.deepcopy(self.reference.state))

    def restore(self, slot: int) -> None:
        """Back to the state kept in `slot`."""
        self._check(slot)
        if slot not in self._saved:
            raise InvalidArgument(f"snapshot slot {slot} holds no state")
        n_past, state = self._saved[slot]
        self._verified = None
        self.reference.n_past, self.reference.state = n_past, copy.deepcopy(state)
        self._logits = None

    def reset(self) -> None:
        self._verified = None
        self.reference.reset()
        self._logits = None

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.snapshots:
            raise InvalidArgument(f"snapshot slot {slot} is outside 0..{self.snapshots - 1}")
