"""The expert cache's replacement policy (strata/expert_policy.hpp) on the host: its rules one by one, and the
native policy against a Python statement of the same rules on random routing."""

from __future__ import annotations

import numpy as np
import pytest

from strata import _native
from strata.errors import InvalidArgument

LFRU = {"replace": True, "admit_after": 2, "window": 4, "max_copies": 8}


def policy(slots, n_expert=16, **options):
    p = _native.ReplacementPolicy(list(slots), n_expert, {**LFRU, **options})
    for layer, count in enumerate(slots):
        p.hold(layer, range(count))
    return p


def token(p, routed: dict[int, list[int]]):
    """One token: note each layer's ids, then the moves its end begins."""
    hits = {layer: p.note(layer, np.array(ids, np.int32)) for layer, ids in routed.items()}
    return hits, p.plan()


def test_an_expert_that_misses_often_enough_replaces_the_least_recently_used_slot():
    p = policy([3])
    assert token(p, {0: [0, 9]}) == ({0: 1}, [])       # slot 0 used; 9 missed once
    assert token(p, {0: [1, 9]}) == ({0: 1}, [(0, 2, 9, 2)])  # missed twice: into slot 2 (expert 2, never used)
    assert p.slot_of(0, 2) == -1 and p.slot_of(0, 9) == -1   # evicted at once, admitted when the copy is done
    hits, moves = token(p, {0: [9]})
    assert hits == {0: 0} and moves == []                    # in flight: neither a hit nor a new candidate
    p.complete((0, 2, 9, 2))
    assert p.slot_of(0, 9) == 2 and token(p, {0: [9]})[0] == {0: 1}


def test_misses_farther_apart_than_the_window_do_not_add_up():
    p = policy([2], window=3)
    token(p, {0: [7]})
    for _ in range(3):
        token(p, {0: [0]})
    assert token(p, {0: [7]})[1] == []        # 4 tokens after the first miss: counted from 1 again
    assert token(p, {0: [7]})[1] == [(0, 1, 7, 1)]


def test_a_slot_used_by_the_token_is_never_the_victim():
    p = policy([2])
    token(p, {0: [5]})
    assert token(p, {0: [0, 1, 5]})[1] == []  # both slots used this token: 5 waits
    assert token(p, {0: [0, 5]})[1] == [(0, 1, 5, 1)]


def test_the_copy_budget_is_shared_by_the_layers_in_turn():
    p = policy([2, 2, 2], max_copies=1)
    for _ in range(2):
        hits, moves = token(p, {0: [8], 1: [8], 2: [8]})
    assert len(moves) == 1
    served = {moves[0][0]}
    for _ in range(2):  # the next tokens start one layer further: every layer gets its copy
        _, moves = token(p, {0: [8], 1: [8], 2: [8]})
        served |= {m[0] for m in moves}
    assert served == {0, 1, 2}


def test_a_static_policy_never_moves_and_a_layer_without_slots_has_no_hits():
    p = _native.ReplacementPolicy([2, 0], 16, {"replace": False})
    p.hold(0, [3, 4])
    for _ in range(10):
        assert token(p, {0: [3, 9], 1: [3, 9]}) == ({0: 1, 1: 0}, [])


def test_bad_input_is_refused_with_the_limit():
    with pytest.raises(InvalidArgument, match="slots must be in 0..16"):
        _native.ReplacementPolicy([17], 16, LFRU)
    with pytest.raises(InvalidArgument, match="admit_after and window must be >= 1"):
        _native.ReplacementPolicy([2], 16, {**LFRU, "window": 0})
    with pytest.raises(InvalidArgument, match="unknown speed"):
        _native.ReplacementPolicy([2], 16, {"speed": 1})
    p = policy([2])
    with pytest.raises(InvalidArgument, match="routed id 16 is outside 0..15"):
        p.note(0, np.array([16], np.int32))
    with pytest.raises(InvalidArgument, match="layer 1 is outside 0..0"):
        p.note(1, np.array([0], np.int32))
    with pytest.raises(InvalidArgument, match="has no copy in flight"):
        p.complete((0, 1, 5, 1))
    with pytest.raises(InvalidArgument, match="given twice"):
        p.hold(0, [1, 1])


class Statement:
    """The rules of strata/expert_policy.hpp as its header states them, in Python: the independent side."""

    def __init__(self, slots, n_expert, admit_after, window, max_copies):
        self.n, self.admit, self.window, self.max = n_expert, admit_after, window, max_copies
        self.experts = [list(range(s)) for s in slots]           # expert per slot, -1 empty or filling
        self.filling = [[False] * s for s in slots]
        self.last_use = [[-1] * s for s in slots]
        self.last_miss = [[-(1 << 40)] * n_expert for _ in slots]
        self.misses = [[0] * n_expert for _ in slots]
        self.incoming = [set() for _ in slots]
        self.candidates = [[] for _ in slots]
        self.t = 0

    def note(self, layer, ids):
        if not self.experts[layer]:
            return 0
        hits = 0
        for e in ids:
            if e in self.experts[layer]:
                self.last_use[layer][self.experts[layer].index(e)] = self.t
                hits += 1
                continue
            if e in self.incoming[layer]:
                continue
            near = self.t - self.last_miss[layer][e] <= self.window
            self.misses[layer][e] = self.misses[layer][e] + 1 if near else 1
            self.last_miss[layer][e] = self.t
            if self.misses[layer][e] >= self.admit and e not in self.candidates[layer]:
                self.candidates[layer].append(e)
        return hits

    def plan(self):
        moves, layers = [], len(self.experts)
        for i in range(layers):
            layer = (self.t + i) % layers
            for e in self.candidates[layer]:
                if len(moves) >= self.max:
                    break
                free = [s for s in range(len(self.experts[layer]))
                        if not self.filling[layer][s] and self.last_use[layer][s] != self.t]
                if not free:
                    break
                victim = min(free, key=lambda s: (self.last_use[layer][s], s))
                moves.append((layer, victim, e, self.experts[layer][victim]))
                self.experts[layer][victim] = -1
                self.filling[layer][victim] = True
                self.incoming[layer].add(e)
                self.misses[layer][e] = 0
            self.candidates[layer] = []
        self.t += 1
        return moves

    def complete(self, move):
        layer, slot, e, _ = move
        self.experts[layer][slot] = e
        self.filling[layer][slot] = False
        self.incoming[layer].discard(e)
        self.last_use[layer][slot] = self.t


@pytest.mark.parametrize("options", [dict(admit_after=2, window=4, max_copies=3),
                                     dict(admit_after=1, window=1, max_copies=100),
                                     dict(admit_after=3, window=16, max_copies=2)], ids=str)
def test_the_native_policy_follows_its_statement_on_random_routing(rng, options):
    slots, n_expert, k = [3, 5, 0, 2], 12, 4
    native = policy(slots, n_expert, **options)
    statement = Statement(slots, n_expert, **options)
    pending: list[tuple] = []
    hot = rng.choice(n_expert, 5, replace=False)  # some locality, so that admissions happen
    for _ in range(300):
        for move in pending:
            native.complete(move)
            statement.complete(move)
        for layer in range(len(slots)):
            pick = rng.choice(hot, k, replace=False) if rng.random() < 0.6 else rng.choice(n_expert, k, replace=False)
            ids = pick.astype(np.int32)
            assert native.note(layer, ids) == statement.note(layer, [int(e) for e in ids])
        pending = native.plan()
        assert pending == statement.plan()
        for layer in range(len(slots)):
            assert [native.slot_of(layer, e) for e in range(n_expert)] == \
                [statement.experts[layer].index(e) if e in statement.experts[layer] else -1 for e in range(n_expert)]
