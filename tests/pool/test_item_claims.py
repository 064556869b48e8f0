"""How a layer job hands out its work items (cuda/src/cpu/item_claims.hpp): each participant claims its own
contiguous segment first, in order, then the others' from the next one on; every item goes out exactly once,
whatever the number of segments and participants and however late some of them start."""

from __future__ import annotations

import numpy as np
import pytest

_check = pytest.importorskip("strata._native_check")


def segment_starts(items: int, parts: int) -> list[int]:
    return [items * s // parts for s in range(parts + 1)]


@pytest.mark.parametrize("items, parts", [(0, 3), (1, 1), (7, 1), (200, 16), (400, 15), (10, 16), (3, 5)])
def test_a_participant_alone_walks_its_segment_then_the_others_in_turn(items, parts):
    starts = segment_starts(items, parts)
    for p in range(parts):
        want = [i for s in range(parts) for i in range(starts[(p + s) % parts], starts[(p + s) % parts + 1])]
        assert _check.claim_order(items, parts, p).tolist() == want


def test_one_segment_is_the_shared_counter_in_order():
    assert _check.claim_order(50, 1, 0).tolist() == list(range(50))


@pytest.mark.parametrize("seed", range(6))
def test_every_item_goes_out_once_among_racing_and_late_participants(seed):
    rng = np.random.default_rng(seed)
    participants = int(rng.integers(2, 17))
    items = int(rng.integers(1, 5000))
    delays = rng.choice([0, 0, 0, 200, 2000], participants).astype(np.int32)
    claimed_by, claims = _check.claim_items(items, participants, delays)
    assert np.all(claims == 1), f"items handed out {np.unique(claims)} times"
    assert claimed_by.min() >= 0 and claimed_by.max() < participants


def test_a_participant_that_never_comes_loses_its_segment_to_the_others():
    items, participants = 1000, 4
    delays = np.array([0, 0, 0, 200_000], np.int32)  # the last starts once the work is long gone
    claimed_by, claims = _check.claim_items(items, participants, delays)
    assert np.all(claims == 1)
    late = segment_starts(items, participants)[3:5]
    assert np.all(claimed_by[late[0]:late[1]] != 3)


def test_bad_arguments_are_refused():
    from strata.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="parts >= 1"):
        _check.claim_order(10, 0, 0)
    with pytest.raises(InvalidArgument, match="0 <= p < parts"):
        _check.claim_order(10, 2, 2)
    with pytest.raises(InvalidArgument, match="participants"):
        _check.claim_items(10, 2, [])
