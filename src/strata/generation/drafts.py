"""Drafted tokens that need no weights, for a verification step to check (strata.sampling.verify_drafts).

Prompt lookup (as llama.cpp's lookup decoding and transformers' prompt_lookup_num_tokens propose): the longest
n-gram that ends the sequence and occurred earlier in it proposes the tokens that followed its most recent earlier
occurrence. Any model, no weights; it drafts well where the output repeats its context (code edits, extraction,
quotes) and proposes nothing where no n-gram recurs.

A session drafts through a Drafter: LookupDrafter, ForcedDrafter, which proposes the target's own continuation
at a chosen acceptance rate (tests and benchmarks measure the speedup curve with it, without trained weights), or
an engine's own: the reference's MtpDrafter (strata.reference.mtp) runs the model file's MTP block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from strata.errors import InvalidArgument
from strata.generation.arguments import checked_integer, checked_number


def lookup_draft(history: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to `k` tokens proposed to follow `history`: for n from max_ngram down to min_ngram, the last n tokens'
    most recent earlier occurrence (it may overlap them), and the up to k tokens after it; none when no such n-gram
    recurs. One vectorised pass over the history per n tried."""
    if k < 0 or min_ngram < 1 or max_ngram < min_ngram:
        raise InvalidArgument(f"lookup_draft needs k >= 0 and 1 <= min_ngram <= max_ngram, got k={k}, "
                              f"min_ngram={min_ngram}, max_ngram={max_ngram}")
    tokens = np.asarray(history, dtype=np.int64)
    for n in range(min(max_ngram, tokens.size - 1), min_ngram - 1, -1):
        if k == 0:
            break
        # Windows starting at 0 .. size - n - 1: every earlier place of the last n tokens, the last one excluded.
        windows = sliding_window_view(tokens[:-1], n)
        found = np.flatnonzero(np.all(windows == tokens[-n:], axis=1))
        if found.size:
            start = int(found[-1]) + n
            return tokens[start:start + k].tolist()
    return []


MAX_DRAFT_TOKENS = 7  # the most drafts one verify checks: a session's engine verifies this many + 1 rows
DEFAULT_DRAFT_TOKENS = 4  # a session's draft_tokens unless told
DRAFTS = ("lookup", "auto", "mtp")  # the names a session's `draft` option takes


class Drafter(Protocol):
    """Proposes the tokens that may follow a sequence, for one verify to check.

    `propose(history, k)` returns at most k token ids to follow `history` (the whole sequence, the token produced
    last included); none is fine, the session then steps plainly. Optional: `draft_probs(history, drafts)`, the
    drafter's distribution q [len(drafts), vocab] at each drafted position, for sampling's min(1, p/q) rule; a
    drafter without it (or returning None) proposes with certainty, as prompt lookup does."""

    def propose(self, history: Sequence[int], k: int) -> list[int]: ...


class LookupDrafter:
    """Prompt lookup (lookup_draft) as a Drafter: n-grams of `min_ngram`..`max_ngram` tokens."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        lookup_draft([], 0, max_ngram, min_ngram)  # refuses bad n-gram bounds now, not at the first step
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        return lookup_draft(history, k, self.max_ngram, self.min_ngram)


class ForcedDrafter:
    """Drafts at a chosen acceptance rate without trained weights, for tests and benchmarks: `continuation` is the
    target's own greedy sequence, indexed by position (continuation[i] the token at position i); each drafted
    position proposes it with probability `p`, else another of the `vocab` ids, drawn from `seed`'s generator.
    Nothing is proposed past the continuation's end."""

    def __init__(self, continuation: Sequence[int], p: float, seed: int | None = None, *, vocab: int):
        if checked_integer("ForcedDrafter's vocab", vocab) < 2:
            raise InvalidArgument(f"ForcedDrafter's vocab must be >= 2 (a wrong token must exist), got {vocab}")
        if not 0.0 <= checked_number("ForcedDrafter's p", p) <= 1.0:
            raise InvalidArgument(f"ForcedDrafter's p must be a probability in [0, 1], got {p}")
        tokens = np.asarray(continuation)
        if tokens.ndim != 1 or (tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0
                                                  or tokens.max() >= vocab)):
            raise InvalidArgument(f"ForcedDrafter's continuation must be a list of token ids in 0..{vocab - 1}")
        self.continuation, self.p, self.vocab = tokens.astype(np.int64), float(p), int(vocab)
        self._rng = np.random.default_rng(seed)

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        right = self.continuation[len(history):len(history) + k]
        hit = self._rng.random(right.size) < self.p
        wrong = (right + 1 + self._rng.integers(0, self.vocab - 1, right.size)) % self.vocab
        return np.where(hit, right, wrong).tolist()


def checked_draft_tokens(draft_tokens: int, name: str = "draft_tokens") -> int:
    """`draft_tokens` (the option called `name`) if it is in 1..MAX_DRAFT_TOKENS, else InvalidArgument."""
    if not 1 <= checked_integer(name, draft_tokens) <= MAX_DRAFT_TOKENS:
        raise InvalidArgument(f"{name} must be in 1..{MAX_DRAFT_TOKENS}, got {draft_tokens}")
    return draft_tokens


def verify_rows(drafter: Drafter | None, draft_tokens: int) -> int:
    """The most rows one verification of a session takes: its pending token and its drafts (0: no drafter). Each
    row keeps its recurrent state, so an engine holds as many state slots more."""
    return draft_tokens + 1 if drafter is not None else 0


def named_drafter(draft: str | None, draft_tokens: int, mtp: Callable[[], Drafter] | None = None) -> Drafter | None:
    """The drafter a session's `draft` option names (None: no drafts), after checking `draft_tokens`
    (1..MAX_DRAFT_TOKENS). "auto" is prompt lookup, the one drafter that needs no weights; "mtp" is what `mtp`
    makes (the engine's MTP drafter, which raises where the file has no block), refused where the engine has none."""
    checked_draft_tokens(draft_tokens)
    if draft is None:
        return None
    if draft == "mtp":
        if mtp is None:
            raise InvalidArgument("draft 'mtp': MTP drafts run on the reference engine only, for now; use "
                                  "draft='lookup'")
        return mtp()
    if draft in ("lookup", "auto"):
        return LookupDrafter()
    raise InvalidArgument(f"unknown draft {draft!r:.80}; choose None or one of {', '.join(DRAFTS)}")
