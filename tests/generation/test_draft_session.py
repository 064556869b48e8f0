"""Drafted decoding in the Session (verify, accept, truncate) against plain stepping: greedy output and the engine's
sequence identical, bit for bit, whatever the drafter proposes and wherever the call ends (EOS, a stop string,
max_tokens, the context, a stream left early) inside a verified window; prefix reuse after rolled-back steps on
the reference engine; with sampling, tokens distributed as stepping's (a frequency test, bound below)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import strata
from strata.format import inspect
from strata.generation import Session
from strata.generation.draft_length import DraftLength, FixedDraftLength
from strata.generation.drafts import ForcedDrafter, LookupDrafter
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import SamplingParams, apply_repeat_penalty, candidates
from support.char_engine import CharCodec
from support.table_engine import TableEngine

VOCAB = 64
PROMPT = [40, 41, 42, 43]


def table(rng: np.random.Generator, vocab: int = VOCAB) -> np.ndarray:
    """Random logits per last token; EOS (0) never the most likely, so greedy runs to max_tokens."""
    t = (rng.standard_normal((vocab, vocab)) * 3).astype(np.float32)
    t[:, 0] = -30.0
    return t


class WrongAt:
    """Proposes the greedy `continuation` (indexed by position), except the draft at window index `wrong`."""

    def __init__(self, continuation: list[int], wrong: int):
        self.continuation, self.wrong = continuation, wrong

    def propose(self, history, k):
        drafts = self.continuation[len(history):len(history) + k]
        if self.wrong < len(drafts):
            drafts[self.wrong] = drafts[self.wrong] % (VOCAB - 1) + 1  # another id, never EOS
        return drafts


def stepped(t: np.ndarray, prompt=PROMPT, context: int = 64, **kwargs) -> tuple[list[int], Session]:
    session = Session(TableEngine(t, context), CharCodec())
    return list(session.complete(prompt, **kwargs).tokens), session


def drafted(t: np.ndarray, drafter, k: int, policy=None, context: int = 64, prompt=PROMPT, **kwargs
            ) -> tuple[list[int], Session]:
    session = Session(TableEngine(t, context, verify_rows=k + 1), CharCodec(), drafter, k,
                      draft_length=policy or FixedDraftLength(k))
    return list(session.complete(prompt, **kwargs).tokens), session


def forced(continuation: list[int], p: float, rng) -> ForcedDrafter:
    return ForcedDrafter(continuation, p, int(rng.integers(2**32)), vocab=VOCAB)


@pytest.mark.parametrize("penalty", [1.0, 1.4])
@pytest.mark.parametrize("p", [0.0, 0.5, 0.9, 1.0])
def test_greedy_output_and_sequence_are_steppings_whatever_is_drafted(rng, penalty, p):
    t = table(rng)
    want, plain = stepped(t, max_tokens=40, repeat_penalty=penalty)
    for policy in (FixedDraftLength(4), DraftLength(4)):
        got, session = drafted(t, forced(PROMPT + want, p, rng), 4, policy, max_tokens=40, repeat_penalty=penalty)
        assert got == want and session.engine.sequence == plain.engine.sequence and session.tokens == plain.tokens
        assert session.stats.finish_reason == "length" and session.stats.generated_tokens == 40
    if p == 1.0:  # every draft taken: each verify yields 5 tokens, the first comes from the prompt
        assert session.stats.accepted == session.stats.drafted and session.stats.acceptance_rate == 1.0
    if p == 0.0:
        assert session.stats.accepted == 0 and session.stats.tokens_per_step == 1.0


def test_a_rejection_at_every_position_of_the_window(rng):
    t = table(rng)
    want, plain = stepped(t, max_tokens=30)
    k = 4
    for wrong in range(k + 1):  # k: no wrong draft at all
        got, session = drafted(t, WrongAt(PROMPT + want, wrong), k, max_tokens=30)
        assert got == want and session.engine.sequence == plain.engine.sequence, wrong
        verifies = [n for call, n in session.engine.calls if call == "verify"]
        assert verifies[0] == k + 1, (wrong, verifies)  # later ones shorter as max_tokens nears
        truncates = [n for call, n in session.engine.calls if call == "truncate"]
        assert len(truncates) == sum(n - 1 > wrong for n in verifies), (wrong, verifies)
        assert session.stats.accepted == sum(min(n - 1, wrong) for n in verifies), wrong


def test_logprobs_of_verified_tokens_are_steppings(rng):
    t = table(rng)
    plain = Session(TableEngine(t), CharCodec()).complete(PROMPT, max_tokens=12, logprobs=3)
    session = Session(TableEngine(t, verify_rows=4), CharCodec(), WrongAt(PROMPT + list(plain.tokens), 2), 3,
                      draft_length=FixedDraftLength(3))
    got = session.complete(PROMPT, max_tokens=12, logprobs=3)
    assert got.pieces == plain.pieces


def test_eos_inside_an_accepted_window_ends_the_answer_and_is_fed_first_next_time(rng):
    t = table(rng)
    chain = [PROMPT[-1], *rng.choice(np.arange(1, 40), size=6, replace=False).tolist(), 0]
    t[chain[:-1], chain[1:]] = 100.0  # greedy answers the chain's six tokens, then EOS
    want, plain = stepped(t, max_tokens=12)
    assert len(want) == 6 and plain.stats.finish_reason == "eos"
    got, session = drafted(t, forced(PROMPT + want + [0, 5, 6, 7], 1.0, rng), 4, max_tokens=12)
    assert got == want and session.stats.finish_reason == "eos"
    assert session.engine.sequence == plain.engine.sequence and session.tokens == plain.tokens  # EOS pending
    assert ("truncate", len(plain.engine.sequence)) in session.engine.calls
    more = list(session.generate([9], max_tokens=5))  # the EOS first, then the new prompt
    assert [p.token for p in more] == [p.token for p in plain.generate([9], max_tokens=5)]
    assert session.engine.sequence == plain.engine.sequence


def test_a_stop_string_inside_a_window_ends_the_answer_where_stepping_does(rng):
    t = table(rng)
    want, _ = stepped(t, max_tokens=20)
    stop = "".join(map(chr, want[7:9]))
    want, plain = stepped(t, max_tokens=20, stop=stop)
    got, session = drafted(t, forced(PROMPT + want, 1.0, rng), 5, max_tokens=20, stop=stop)
    assert got == want and session.stats.finish_reason == plain.stats.finish_reason == "stop"
    assert session.engine.sequence == plain.engine.sequence and session.tokens == plain.tokens


@pytest.mark.parametrize("context", [9, 12, 13])
def test_the_context_end_inside_a_window(rng, context):
    t = table(rng)
    want, plain = stepped(t, context=context, max_tokens=None)
    assert plain.stats.finish_reason == "context"
    got, session = drafted(t, forced(PROMPT + want, 1.0, rng), 4, context=context, max_tokens=None)
    assert got == want and session.stats.finish_reason == "context"
    assert session.engine.sequence == plain.engine.sequence
    # a verify never takes the engine past where stepping may go: the last position stays free for the answer
    assert session.engine.furthest == plain.engine.furthest == context - 1


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 7])
def test_max_tokens_inside_a_window(rng, max_tokens):
    t = table(rng)
    want, plain = stepped(t, max_tokens=max_tokens)
    got, session = drafted(t, forced(PROMPT + want + [1] * 8, 1.0, rng), 4, max_tokens=max_tokens)
    assert got == want and session.stats.finish_reason == "length"
    assert session.engine.sequence == plain.engine.sequence
    # The drafts are capped to what max_tokens leaves: nothing is verified that the caller could not take.
    assert "truncate" not in [call for call, _ in session.engine.calls]


@pytest.mark.parametrize("leave_after", [1, 2, 3, 4, 5, 6])
def test_a_stream_left_early_inside_a_window_then_continued(rng, leave_after):
    t = table(rng)
    want, plain = stepped(t, max_tokens=25)
    # every draft right: the windows yield tokens 2..6, 7..11, ... of the answer
    session = Session(TableEngine(t, verify_rows=5), CharCodec(), forced(PROMPT + want, 1.0, rng), 4,
                      draft_length=FixedDraftLength(4))
    got = []
    for piece in session.generate(PROMPT, max_tokens=25):
        got.append(piece.token)
        if len(got) == leave_after:
            break
    assert got == want[:leave_after] and session.stats.finish_reason == "cancelled"
    # the engine holds what stepping would: every token received but the last, which is pending
    assert session.engine.sequence == PROMPT + want[:leave_after - 1]
    assert session.tokens == PROMPT + want[:leave_after]
    rest = [p.token for p in session.stream(PROMPT + want[:leave_after], max_tokens=25 - leave_after)]
    assert got + rest == want and session.engine.sequence == plain.engine.sequence


def always_right(engine, want, rng) -> Session:
    """A session drafting 4 tokens a step, each of them the stepped continuation `want`."""
    return Session(engine, CharCodec(), forced(PROMPT + want, 1.0, rng), 4, draft_length=FixedDraftLength(4))


class InterruptedVerify(TableEngine):
    """Sends SIGINT to this process while its first verify computes, as a Ctrl-C mid-step."""

    def verify(self, ids, seen):
        rows = super().verify(ids, seen)
        if [call for call, _ in self.calls].count("verify") == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return rows


def test_ctrl_c_during_a_verify_ends_the_call_at_the_next_token_and_truncates(rng):
    t = table(rng)
    want, _ = stepped(t, max_tokens=10)
    session = always_right(InterruptedVerify(t, verify_rows=5), want, rng)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for piece in session.generate(PROMPT, max_tokens=10):
            got.append(piece.token)
    # the prompt's token, then the window's first: the call ends there, holding what was shown
    assert got == want[:2] and session.stats.finish_reason == "interrupted"
    assert session.engine.sequence == PROMPT + want[:1] and session.tokens == PROMPT + want[:2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    rest = [p.token for p in session.stream(PROMPT + want[:2], max_tokens=8)]
    assert got + rest == want


def test_an_exception_in_the_consumer_inside_a_window_loses_nothing(rng):
    t = table(rng)
    want, _ = stepped(t, max_tokens=10)
    session = always_right(TableEngine(t, verify_rows=5), want, rng)
    got = []
    with pytest.raises(RuntimeError):
        for piece in session.generate(PROMPT, max_tokens=10):
            got.append(piece.token)
            if len(got) == 3:
                raise RuntimeError("the consumer failed")
    assert session.engine.sequence == PROMPT + want[:2] and session.stats.finish_reason == "cancelled"


def test_the_engine_is_asked_for_drafts_only_when_it_verifies(rng):
    t = table(rng)
    drafter = LookupDrafter()
    with pytest.raises(strata.InvalidArgument, match=r"cannot verify drafts \(verify_rows 0"):
        Session(TableEngine(t, verify_rows=0), CharCodec(), drafter, 2)
    with pytest.raises(strata.InvalidArgument, match=r"draft_tokens must be in 1..3 \(the engine verifies at most 4"):
        Session(TableEngine(t, verify_rows=4), CharCodec(), drafter, 4)
    with pytest.raises(strata.InvalidArgument, match="draft_tokens must be in 1..3"):
        Session(TableEngine(t, verify_rows=4), CharCodec(), drafter, 0)
    with pytest.raises(strata.InvalidArgument, match="draft_tokens and draft_length need a drafter"):
        Session(TableEngine(t), CharCodec(), None, 2)
    with pytest.raises(strata.InvalidArgument, match="draft_tokens must be an integer"):
        Session(TableEngine(t), CharCodec(), drafter, 2.0)


def test_a_drafted_token_outside_the_vocabulary_is_refused_before_the_engine_sees_it(rng):
    class Codec(CharCodec):
        tokens = [chr(i) for i in range(VOCAB)]

    class OutOfVocabulary:
        def propose(self, history, k):
            return [5, VOCAB]

    session = Session(TableEngine(table(rng), verify_rows=3), Codec(), OutOfVocabulary(), 2,
                      draft_length=FixedDraftLength(2))
    with pytest.raises(strata.InvalidArgument, match=f"the drafter proposed token id {VOCAB}, outside the "
                                                     f"vocabulary 0..{VOCAB - 1}"):
        session.complete(PROMPT, max_tokens=5)
    assert session.engine.sequence == PROMPT and session.tokens == PROMPT + [session.tokens[-1]]
    assert [call for call, _ in session.engine.calls] == ["feed"]


# ----------------------------------------------------------------------------------- the reference engine

@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next"])
def model_file(request, tiny_model):
    with inspect(tiny_model(request.param, seed=4)) as file:
        yield file


def reference_session(model_file, drafter=None, k=0, policy=None, snapshots=4) -> Session:
    engine = ReferenceEngine(Reference(model_file), 96, snapshots, verify_rows=k + 1 if drafter else 0)
    return Session(engine, model_file.tokenizer(), drafter, k, draft_length=policy)


def prompt_ids(model_file, rng, n: int) -> list[int]:
    g = model_file.geometry
    eos = set(model_file.tokenizer().eos_ids) | ({g.ple_eos} if g.ple_layers else set())
    ids = [int(t) for t in rng.integers(0, g.n_vocab, 4 * n) if int(t) not in eos][:n]
    return ids + ids  # a prompt that repeats itself: prompt lookup finds n-grams


def test_reference_greedy_output_is_steppings_with_every_drafter(model_file, rng):
    prompt = prompt_ids(model_file, rng, 8)
    plain = reference_session(model_file)
    # ignore_eos: an answer that ends on its first token drafts nothing (it did on one seed), and so shows nothing
    want = plain.complete(prompt, max_tokens=16, logprobs=2, ignore_eos=True)
    vocab = model_file.geometry.n_vocab
    continuation = prompt + list(want.tokens)
    for drafter, k, policy in ((LookupDrafter(), 4, None),
                               (ForcedDrafter(continuation, 0.6, int(rng.integers(2**32)), vocab=vocab), 3,
                                FixedDraftLength(3)),
                               (WrongAt(continuation, 1), 3, FixedDraftLength(3))):
        session = reference_session(model_file, drafter, k, policy)
        got = session.complete(prompt, max_tokens=16, logprobs=2, ignore_eos=True)
        assert got.tokens == want.tokens and got.pieces == want.pieces  # logprobs too, bit for bit
        assert session.engine.position == plain.engine.position
    assert 0 < session.stats.accepted < session.stats.drafted  # WrongAt: each window takes one draft, cuts there


def test_reference_verify_rows_are_steppings_and_truncate_goes_back_exactly(model_file, rng):
    ids = prompt_ids(model_file, rng, 5)
    stepper, verifier = ReferenceEngine(Reference(model_file)), ReferenceEngine(Reference(model_file), verify_rows=5)
    stepper.prefill(ids[:4], ids[:4])
    verifier.prefill(ids[:4], ids[:4])
    rows = verifier.verify(ids[4:9], ids[:9])
    assert rows.dtype == np.float32 and rows.shape == (5, model_file.geometry.n_vocab)
    for i, token in enumerate(ids[4:9]):
        stepper.feed([token], SamplingParams(), 0.0, ids[:5 + i])
        np.testing.assert_array_equal(rows[i], stepper._logits)  # bit for bit: the same arithmetic
    verifier.truncate(7)
    verifier.truncate(6)  # again, further back: still within the verify's rows
    assert verifier.position == 6
    again = ReferenceEngine(Reference(model_file))
    again.prefill(ids[:4], ids[:4])
    for n in range(5, 8):  # steps ids[4], ids[5], ids[6]
        again.feed([ids[n - 1]], SamplingParams(), 0.0, ids[:n])
    verifier.feed([ids[6]], SamplingParams(), 0.0, ids[:7])
    np.testing.assert_array_equal(verifier._logits, again._logits)
    with pytest.raises(strata.InvalidArgument, match="truncate comes right after a verify"):
        verifier.truncate(7)  # the feed moved the sequence
    verifier.verify(ids[7:9], ids[:9])
    with pytest.raises(strata.InvalidArgument, match="outside the last verify's positions 8..9"):
        verifier.truncate(7)
    with pytest.raises(strata.InvalidArgument, match=r"verify takes 1..5 ids \(verify_rows\), got 6"):
        verifier.verify(ids[:6], ids[:6])
    with pytest.raises(strata.InvalidArgument, match=r"made without verify \(verify_rows 0\)"):
        ReferenceEngine(Reference(model_file), verify_rows=0).verify(ids[:1], ids[:1])


def test_reference_prefix_reuse_after_rolled_back_steps(model_file, rng):
    """A second prompt extending the first (the answer, then more) feeds only its new tokens after windows that
    were truncated, and answers as a session that stepped everything."""
    first = prompt_ids(model_file, rng, 6)
    plain = reference_session(model_file)
    # ignore_eos: an answer that ends on its first token drafts nothing (it did on one seed)
    answer = list(plain.complete(first, max_tokens=10, ignore_eos=True).tokens)
    drafter = WrongAt(first + answer, 1)  # every window rejects its second draft and is truncated
    session = reference_session(model_file, drafter, 3, FixedDraftLength(3))
    assert list(session.complete(first, max_tokens=10, ignore_eos=True).tokens) == answer
    assert session.stats.accepted < session.stats.drafted
    second = first + answer + prompt_ids(model_file, rng, 3)
    want = plain.complete(second, max_tokens=8)
    drafter.continuation = second + list(want.tokens)
    got = session.complete(second, max_tokens=8)
    assert got.tokens == want.tokens and got.usage.cached_tokens == want.usage.cached_tokens == len(first) + 9
    np.testing.assert_array_equal(session.engine.reference.forward([1]), plain.engine.reference.forward([1]))


# ------------------------------------------------------------------------------------------------ sampling

V = 6
TRIALS = 20_000
# Each (y1, y2) pair's frequency must lie within 5.5 binomial standard deviations (+ 1 / TRIALS) of its
# probability: a two-sided normal tail of 3.8e-8 per cell, under 1.4e-6 for the 36 cells of one case.
SIGMAS = 5.5


class QDrafter:
    """Draws each draft from its own random distribution q over the vocabulary and reports q (draft_probs)."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.q = rng, rng.dirichlet(np.ones(V), size=V)  # q depends on the previous token

    def propose(self, history, k):
        out = [history[-1]]
        for _ in range(k):
            out.append(int(self.rng.choice(V, p=self.q[out[-1]])))
        return out[1:]

    def draft_probs(self, history, drafts):
        return self.q[[history[-1], *drafts[:-1]]]


class NoEosCodec(CharCodec):
    eos_ids: list[int] = []


def p_next(t: np.ndarray, params: SamplingParams, seen: list[int]) -> np.ndarray:
    ids, probs = candidates(apply_repeat_penalty(t[seen[-1]], seen, params.repeat_penalty), params)
    p = np.zeros(V)
    p[ids] = probs
    return p


def pair_distribution(t: np.ndarray, params: SamplingParams, prompt: list[int]) -> np.ndarray:
    """P(y1, y2): the answer's second and third tokens, summed over its first, when stepping."""
    joint = np.zeros((V, V))
    for y0, p0 in enumerate(p_next(t, params, prompt)):
        for y1, p1 in enumerate(p_next(t, params, prompt + [y0])):
            joint[y1] += p0 * p1 * p_next(t, params, prompt + [y0, y1])
    return joint.reshape(-1)


@pytest.mark.parametrize(("drafter", "params"), [
    ("certain", SamplingParams(temperature=0.8, top_k=4, repeat_penalty=1.3)),
    ("q", SamplingParams(temperature=1.0, min_p=0.05))], ids=str)
def test_sampled_tokens_are_distributed_as_steppings(rng, drafter, params):
    """A certain drafter (ForcedDrafter: right or wrong, q a point mass) and one that draws its drafts from a
    distribution q it reports: the answer's 2nd and 3rd tokens, verified in windows of 2 drafts, follow stepping's
    joint distribution."""
    t = (rng.standard_normal((V, V)) * 1.5).astype(np.float32)
    prompt = [1, 2]
    draft = QDrafter(rng) if drafter == "q" else ForcedDrafter([int(x) for x in rng.integers(V, size=16)], 0.5,
                                                               int(rng.integers(2**32)), vocab=V)
    session = Session(TableEngine(t, verify_rows=3), NoEosCodec(), draft, 2, draft_length=FixedDraftLength(2))
    sampling = {"temperature": params.temperature, "top_k": params.top_k, "min_p": params.min_p,
                "repeat_penalty": params.repeat_penalty}
    pairs = []
    for seed in rng.integers(2**31, size=TRIALS):
        tokens = session.complete(prompt, max_tokens=4, seed=int(seed), **sampling).tokens
        pairs.append(tokens[1] * V + tokens[2])
    assert session.stats.drafted > 0
    p = pair_distribution(t, params, prompt)
    freq = np.bincount(pairs, minlength=V * V) / TRIALS
    bound = SIGMAS * np.sqrt(p * (1 - p) / TRIALS) + 1.0 / TRIALS
    assert np.all(np.abs(freq - p) <= bound), f"{drafter}: frequencies {freq.round(4)} against {p.round(4)}"
