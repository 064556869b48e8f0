"""An engine whose logits depend on the last token fed only (rows of a fixed table), with verify and truncate held
strictly to the Engine protocol's contract: the tests of drafted decoding (tests/generation/test_draft_session.py)
step and verify it without a model, and know every distribution it samples exactly."""

from __future__ import annotations

import numpy as np

from strata.errors import InvalidArgument
from strata.sampling import log_probabilities, sample


class TableEngine:
    """Logits after a token t are table[t]. Records every call in `calls` (("feed", n), ("verify", n),
    ("truncate", position)); checks that `seen` is the sequence it holds plus the ids, so a session whose history
    drifts from the engine's fails at once."""

    def __init__(self, table: np.ndarray, context: int = 64, verify_rows: int = 8):
        self.table = np.asarray(table, dtype=np.float32)
        self.context, self.verify_rows = context, verify_rows
        self.sequence: list[int] = []
        self.calls: list[tuple[str, int]] = []
        self.furthest = 0  # the longest the sequence has been
        self._verified: tuple[int, int] | None = None  # (position before the last verify, ids verified)
        self._logits: np.ndarray | None = None

    @property
    def position(self) -> int:
        return len(self.sequence)

    def feed(self, ids, params, u, seen) -> int:
        self._append("feed", ids, seen)
        self._logits = self.table[self.sequence[-1]]
        return sample(self._logits, params, u, seen)

    def verify(self, ids, seen) -> np.ndarray:
        if not 1 <= len(ids) <= self.verify_rows:
            raise InvalidArgument(f"verify takes 1..{self.verify_rows} ids, got {len(ids)}")
        start = self.position
        self._append("verify", ids, seen)
        self._verified, self._logits = (start, len(ids)), None  # a verified token's logprobs come from its row
        return self.table[list(ids)].copy()

    def truncate(self, position: int) -> None:
        if self._verified is None:
            raise InvalidArgument("truncate without a verify before it")
        start, n = self._verified
        if not start + 1 <= position <= start + n:
            raise InvalidArgument(f"truncate to {position} outside {start + 1}..{start + n}")
        self.calls.append(("truncate", position))
        del self.sequence[position:]
        self._logits = None

    def logprobs(self, token: int, n: int):
        if self._logits is None:
            raise InvalidArgument("logprobs are undefined after a truncate")
        return log_probabilities(self._logits, token, n)

    def reset(self) -> None:
        self.sequence, self._verified, self._logits = [], None, None

    def _append(self, call: str, ids, seen) -> None:
        ids = [int(t) for t in ids]
        if list(seen) != self.sequence + ids:
            raise AssertionError(f"{call}: seen {list(seen)} is not the sequence {self.sequence} plus {ids}")
        if self.position + len(ids) > self.context:
            raise InvalidArgument(f"{call} of {len(ids)} ids past the context {self.context} at {self.position}")
        self.calls.append((call, len(ids)))
        self.sequence += ids
        self.furthest = max(self.furthest, self.position)
        self._verified = None
