"""Prompt lookup (strata.generation.drafts.lookup_draft) against a direct search written out with loops; the
drafters a session takes (LookupDrafter, ForcedDrafter) and the names of its `draft` option."""

import numpy as np
import pytest

import strata
from strata.generation.drafts import ForcedDrafter, LookupDrafter, lookup_draft, named_drafter


def direct_lookup(history: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(history):
            continue
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):  # the most recent earlier place first
            if history[start:start + n] == tail:
                return history[start + n:start + n + k]
    return []


def test_the_longest_recent_ngram_proposes_what_followed_it():
    history = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    # "6 7" recurs twice before the end; its most recent earlier place is followed by 9, 2.
    assert lookup_draft(history, 2, max_ngram=2) == [9, 2]
    # The longer n-gram wins over a more recent shorter one: "1 2 3" at 0 over "3" at 5 (followed by 4, 1, 2).
    assert lookup_draft([1, 2, 3, 9, 9, 3, 4, 1, 2, 3], 3) == [9, 9, 3]
    assert lookup_draft([1, 2, 3], 4) == []  # nothing recurs
    assert lookup_draft([4, 4, 4, 4], 5) == [4]  # an overlapping place: what follows it runs into the end
    assert lookup_draft([7, 1, 7], 3, min_ngram=2) == []
    assert lookup_draft([], 3) == [] and lookup_draft([3], 3) == [] and lookup_draft([1, 1], 0) == []


@pytest.mark.parametrize("vocab", [3, 20])
def test_matches_a_direct_search_on_random_histories(rng, vocab):
    for _ in range(300):
        history = [int(t) for t in rng.integers(vocab, size=int(rng.integers(0, 60)))]
        k, max_ngram = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        min_ngram = int(rng.integers(1, max_ngram + 1))
        assert lookup_draft(history, k, max_ngram, min_ngram) == direct_lookup(history, k, max_ngram, min_ngram), \
            (history, k, max_ngram, min_ngram)


def test_bad_arguments_are_named():
    for kwargs in ({"k": -1}, {"k": 2, "min_ngram": 0}, {"k": 2, "max_ngram": 1, "min_ngram": 2}):
        with pytest.raises(strata.InvalidArgument, match="lookup_draft needs k >= 0 and 1 <= min_ngram"):
            lookup_draft([1, 2, 1], **kwargs)


def test_lookup_drafter_proposes_what_lookup_draft_does():
    history = [5, 6, 7, 8, 1, 6, 7]
    assert LookupDrafter().propose(history, 2) == lookup_draft(history, 2) == [8, 1]
    assert LookupDrafter(max_ngram=1).propose([1, 2, 1, 3, 1], 1) == [3]
    with pytest.raises(strata.InvalidArgument, match="1 <= min_ngram <= max_ngram"):
        LookupDrafter(max_ngram=1, min_ngram=2)


def test_forced_drafter_is_right_at_the_rate_asked(rng):
    vocab, n = 50, 20_000
    continuation = [int(t) for t in rng.integers(vocab, size=n + 10)]
    assert ForcedDrafter(continuation, 1.0, vocab=vocab).propose(continuation[:10], 4) == continuation[10:14]
    wrong = ForcedDrafter(continuation, 0.0, int(rng.integers(2**32)), vocab=vocab).propose(continuation[:10], n)
    assert all(w != c and 0 <= w < vocab for w, c in zip(wrong, continuation[10:]))
    p = float(rng.uniform(0.2, 0.8))
    drafts = ForcedDrafter(continuation, p, int(rng.integers(2**32)), vocab=vocab).propose(continuation[:10], n)
    rate = np.mean(np.asarray(drafts) == continuation[10:])
    assert abs(rate - p) <= 5.5 * np.sqrt(p * (1 - p) / n) + 1 / n, (rate, p)  # a false failure below 4e-8
    # nothing past the continuation's end
    assert ForcedDrafter([1, 2, 3], 1.0, vocab=4).propose([0, 0], 5) == [3]
    assert ForcedDrafter([1, 2, 3], 1.0, vocab=4).propose([0, 0, 0], 5) == []


def test_forced_drafter_refuses_bad_arguments():
    with pytest.raises(strata.InvalidArgument, match="ForcedDrafter's p must be a probability in"):
        ForcedDrafter([1], 1.5, vocab=4)
    with pytest.raises(strata.InvalidArgument, match="ForcedDrafter's vocab must be >= 2"):
        ForcedDrafter([0], 0.5, vocab=1)
    with pytest.raises(strata.InvalidArgument, match=r"continuation must be a list of token ids in 0..3"):
        ForcedDrafter([1, 4], 0.5, vocab=4)
    with pytest.raises(strata.InvalidArgument, match="ForcedDrafter's p must be a number"):
        ForcedDrafter([1], "high", vocab=4)


def test_named_drafters_and_their_errors():
    assert named_drafter(None, 4) is None
    assert isinstance(named_drafter("lookup", 1), LookupDrafter) and isinstance(named_drafter("auto", 7), LookupDrafter)
    for tokens in (0, 8, 9, 2.5, True):
        with pytest.raises(strata.InvalidArgument, match="draft_tokens must be"):
            named_drafter("lookup", tokens)
    with pytest.raises(strata.InvalidArgument, match="MTP drafts run on the reference engine only, for now"):
        named_drafter("mtp", 3)
    mtp = LookupDrafter()  # stands for an engine's MTP drafter: named_drafter returns what the engine makes
    assert named_drafter("mtp", 3, mtp=lambda: mtp) is mtp
    with pytest.raises(strata.InvalidArgument, match="unknown draft 'medusa'; choose None or one of lookup, auto"):
        named_drafter("medusa", 3)


def test_the_draft_bound_is_the_native_sessions_verify_rows():
    """The most drafts a step takes (the generation layer's one fact) and the most rows a GPU session's verification
    keeps (the native core's): the pending token and every draft fit, and no row is kept that no draft could use."""
    from strata import _native
    from strata.generation.drafts import MAX_DRAFT_TOKENS

    assert MAX_DRAFT_TOKENS + 1 == _native.MAX_VERIFY_ROWS <= _native.MAX_STEP_ROWS
