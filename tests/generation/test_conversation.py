"""Conversations on the reference engine: each turn feeds only what the session does not hold, a turn that
diverges rolls back to a state snapshot, and the logits after every turn equal those of a fresh reference fed
the whole conversation; log-probabilities follow their definition."""

from __future__ import annotations

import numpy as np
import pytest

from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import log_probabilities
from support.compare import relative_error

# The reference fed a chunk at once and token by token sums in other orders (float64 inner products, float32
# between layers): test_parity's bound for the same comparison.
BOUND = 1e-4


class CountingEngine(ReferenceEngine):
    """The reference engine, counting the tokens each feed (and prefill) hands it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fed: list[int] = []

    def feed(self, ids, params, u, seen):
        self.fed.append(len(ids))
        return super().feed(ids, params, u, seen)

    def prefill(self, ids, seen):
        self.fed.append(len(ids))
        super().prefill(ids, seen)


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next"])
def model_file(request, tiny_model):
    with inspect(tiny_model(request.param, seed=4)) as file:
        yield file


def fresh_logits(model_file, ids) -> np.ndarray:
    return Reference(model_file).forward(list(ids))[-1]


def random_ids(model_file, rng, n: int) -> list[int]:
    g = model_file.geometry
    eos = set(model_file.tokenizer().eos_ids) | ({g.ple_eos} if g.ple_layers else set())
    return [int(t) for t in rng.integers(0, g.n_vocab, 4 * n) if int(t) not in eos][:n]


def test_each_turn_feeds_only_its_new_tokens_and_matches_a_fresh_session(model_file, rng):
    engine = CountingEngine(Reference(model_file), context=256)
    session = Session(engine, model_file.tokenizer())
    conversation = random_ids(model_file, rng, 9)
    for turn in range(3):
        start = len(engine.fed)
        done = session.complete(conversation, max_tokens=4)
        assert done.usage.prompt_tokens == len(conversation)
        if turn:
            # Only the previous answer's last token (never fed) and the new turn went in: all but the last, then
            # (after a snapshot) the last, whose logits give the answer's first token.
            assert done.usage.cached_tokens == len(conversation) - 7 and engine.fed[start:start + 2] == [6, 1]
        assert relative_error(engine._logits, fresh_logits(model_file, session.tokens[:-1])) < BOUND, turn
        conversation = session.tokens + random_ids(model_file, rng, 6)


def test_a_turn_that_diverges_rolls_back_to_the_last_snapshot(model_file, rng):
    engine = CountingEngine(Reference(model_file), context=256, snapshots=2)
    session = Session(engine, model_file.tokenizer())
    first = random_ids(model_file, rng, 10)
    said = session.complete(first, max_tokens=5).tokens
    # The caller edits the answer (its first token; its EOS if it said nothing): the session goes back to the
    # snapshot taken before the first prompt's last token, and feeds from there. An answer that was EOS alone was
    # never fed: the live state holds the prompt and the edit follows it (some seeds' first token is EOS).
    edited = first + [session.tokens[len(first)] ^ 1] + random_ids(model_file, rng, 3)
    start = len(engine.fed)
    done = session.complete(edited, max_tokens=3)
    cached = len(first) - 1 if said else len(first)
    assert done.usage.cached_tokens == cached
    assert engine.fed[start:start + 2] == [len(edited) - cached - 1, 1]
    assert relative_error(engine._logits, fresh_logits(model_file, session.tokens[:-1])) < BOUND
    # The same prompt again (a retry) feeds one token; one shorter than everything snapshotted starts over.
    assert session.complete(edited, max_tokens=2).usage.cached_tokens == len(edited) - 1
    assert relative_error(engine._logits, fresh_logits(model_file, session.tokens[:-1])) < BOUND
    done = session.complete(first[:4], max_tokens=2)
    assert done.usage.cached_tokens == 0
    assert relative_error(engine._logits, fresh_logits(model_file, session.tokens[:-1])) < BOUND


def test_without_snapshots_a_diverging_turn_starts_over(model_file, rng):
    engine = CountingEngine(Reference(model_file), context=256, snapshots=0)
    session = Session(engine, model_file.tokenizer())
    first = random_ids(model_file, rng, 8)
    session.complete(first, max_tokens=3)
    start = len(engine.fed)
    done = session.complete(first[:-1] + [first[-1] ^ 1], max_tokens=2)
    assert done.usage.cached_tokens == 0 and engine.fed[start] == len(first)


def test_logprobs_follow_the_definition(model_file, rng):
    session = Session(ReferenceEngine(Reference(model_file), context=64), model_file.tokenizer())
    prompt = random_ids(model_file, rng, 5)
    replay = Reference(model_file)
    logits = replay.forward(prompt)[-1]
    for piece in session.generate(prompt, max_tokens=3, logprobs=3, temperature=0.7, seed=3):
        want = log_probabilities(logits, piece.token, 3)
        assert piece.logprob == pytest.approx(want[0], abs=1e-12)
        assert [t for t, _ in piece.top_logprobs] == [t for t, _ in want[1]]
        logits = replay.forward([piece.token])[-1]


def test_log_probabilities_normalise_and_break_ties_to_the_lower_id():
    logits = np.array([1.0, 3.0, 3.0, -2.0], np.float32)
    token, top = log_probabilities(logits, 3, 4)
    assert [t for t, _ in top] == [1, 2, 0, 3]
    assert np.isclose(np.exp([v for _, v in top]).sum(), 1.0) and token == top[-1][1]
