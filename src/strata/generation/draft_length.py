"""How many tokens to draft at each decode step, from what drafting measured so far.

A verify of k drafts costs what it measured (seconds, an EWMA per k) and yields on average
(1 - a^(k+1)) / (1 - a) tokens, a being the running acceptance rate per drafted position (an EWMA over the
positions verified: each accepted draft a 1, the first rejected one a 0, the ones after it unseen). A plain step
yields one token at its own measured cost. The policy picks the k with the most tokens per second, 0 (a plain
step) when no k beats stepping: drafting never makes decoding slower for long, whatever the drafter's acceptance
or the engine's verify cost. One draft is tried first; a longer k is tried when its estimate makes it the best
choice, so a verify that costs several steps is paid once, not once per k. A k not measured yet (never chosen, or
the drafter proposed fewer) is costed on the line through the measured ones: asking for more drafts than a drafter
gives costs nothing, the verify checks what it gave. Every `retry_after` decisions the losing choice is taken
once: a disabled drafter recovers when the text starts repeating, and the plain step's cost stays current while
drafting wins (its first measurement may hold a warm-up, such as a graph capture). While drafting keeps losing,
each retry waits twice as long as the one before, up to MAX_RETRY_AFTER decisions: a losing verify costs steps.

Pure: the caller times the calls and reports them, so the tests run on fake timings.
"""

from __future__ import annotations

from strata.errors import InvalidArgument
from strata.generation.arguments import checked_integer, checked_number

SMOOTHING = 0.2  # weight of the newest measurement in each EWMA
RETRY_AFTER = 32  # decisions of one kind before the other is taken once
MAX_RETRY_AFTER = 1024  # a drafter that keeps losing is retried ever less often: twice the wait each time, to this


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens one verify of k drafts yields on average, each draft accepted with probability `acceptance` while
    the ones before it were: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return sum(acceptance ** i for i in range(k + 1))


def _ewma(old: float | None, new: float, smoothing: float) -> float:
    return new if old is None else old + smoothing * (new - old)


class DraftLength:
    """The adaptive policy: `choose(cap)` before each decode step; `stepped(seconds)` after a plain step,
    `verified(drafts, accepted, seconds)` after a verify of `drafts` drafts of which the first `accepted` were."""

    def __init__(self, max_drafts: int, *, smoothing: float = SMOOTHING, retry_after: int = RETRY_AFTER):
        if checked_integer("max_drafts", max_drafts) < 1:
            raise InvalidArgument(f"max_drafts must be >= 1, got {max_drafts}")
        if not 0.0 < checked_number("smoothing", smoothing) <= 1.0:
            raise InvalidArgument(f"smoothing must be in (0, 1], got {smoothing}")
        if checked_integer("retry_after", retry_after) < 1:
            raise InvalidArgument(f"retry_after must be >= 1, got {retry_after}")
        self.max_drafts, self.smoothing, self.retry_after = max_drafts, smoothing, retry_after
        self.step_seconds: float | None = None
        self.verify_seconds: list[float | None] = [None] * (max_drafts + 1)  # by drafts; [0] unused
        self.acceptance: float | None = None
        self._probed = False  # one draft asked for once
        self._drafting = False  # whether drafting measured faster at the last decision
        self._streak = 0  # decisions in a row that measured as the last one did
        self._retry_drafts_after = retry_after  # while drafting loses: doubles with each retry that loses again

    def choose(self, cap: int) -> int:
        """Drafts to ask for now, at most min(cap, max_drafts); 0: step plainly."""
        limit = min(cap, self.max_drafts)
        if limit < 1 or self.step_seconds is None:
            return 0  # the plain step's cost first: every k is judged against it
        if not self._probed:  # one draft first: the cheapest verify that measures a cost and an acceptance
            self._probed = True
            return 1
        best = max(range(1, limit + 1), key=self._rate)
        drafting = self._rate(best) > 1.0 / self.step_seconds
        self._streak = self._streak + 1 if drafting == self._drafting else 1
        self._drafting = drafting
        if drafting:
            self._retry_drafts_after = self.retry_after
        if self._streak % (self.retry_after if drafting else self._retry_drafts_after) == 0:
            # The losing choice once, so that its measurement stays current. A verify that loses costs several
            # steps, so a drafter that keeps losing waits twice as long each time (a plain step costs little).
            if not drafting:
                self._retry_drafts_after = min(2 * self._retry_drafts_after, max(MAX_RETRY_AFTER, self.retry_after))
            drafting = not drafting
        return best if drafting else 0

    def stepped(self, seconds: float) -> None:
        self.step_seconds = _ewma(self.step_seconds, seconds, self.smoothing)

    def verified(self, drafts: int, accepted: int, seconds: float) -> None:
        if not 0 <= accepted <= drafts <= self.max_drafts or drafts < 1:
            raise InvalidArgument(f"a verify of {drafts} drafts (at most {self.max_drafts}) cannot accept {accepted}")
        self.verify_seconds[drafts] = _ewma(self.verify_seconds[drafts], seconds, self.smoothing)
        for outcome in [1.0] * accepted + [0.0] * (accepted < drafts):
            self.acceptance = _ewma(self.acceptance, outcome, self.smoothing)

    def _rate(self, k: int) -> float:
        """Expected tokens per second of a verify of k drafts (before any verify: as if every draft were taken)."""
        acceptance = 1.0 if self.acceptance is None else self.acceptance
        return expected_tokens(k, acceptance) / self.cost(k)

    def cost(self, k: int) -> float:
        """A verify of k drafts: its measured cost, else a line through the measured ones (the plain step is 0
        drafts) between its neighbours or on from the last two; with nothing verified yet, the plain step's."""
        if self.step_seconds is None:
            raise InvalidArgument("a verify's cost is estimated once a plain step has been measured (stepped)")
        points = [(0, self.step_seconds)] + [(n, c) for n, c in enumerate(self.verify_seconds) if n and c is not None]
        below = [(n, c) for n, c in points if n <= k]
        above = [(n, c) for n, c in points if n > k]
        n0, c0 = below[-1]
        if n0 == k:
            return c0
        if above:
            n1, c1 = above[0]
            return c0 + (c1 - c0) * (k - n0) / (n1 - n0)
        if len(points) < 2:
            return c0
        (na, ca), (nb, cb) = points[-2:]
        return cb + max(cb - ca, 0.0) / (nb - na) * (k - nb)


class FixedDraftLength:
    """Always `drafts` (within the cap): for benchmarks of one draft length and for tests that need the window
    they wrote. Measurements are ignored."""

    def __init__(self, drafts: int):
        if checked_integer("drafts", drafts) < 0:
            raise InvalidArgument(f"drafts must be >= 0, got {drafts}")
        self.drafts = drafts

    def choose(self, cap: int) -> int:
        return max(0, min(cap, self.drafts))

    def stepped(self, seconds: float) -> None:
        pass

    def verified(self, drafts: int, accepted: int, seconds: float) -> None:
        pass
