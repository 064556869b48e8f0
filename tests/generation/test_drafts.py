"""Prompt lookup (strata.generation.drafts.lookup_draft) against a direct search written out with loops."""

import numpy as np
import pytest

import strata
from strata.generation.drafts import lookup_draft


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
