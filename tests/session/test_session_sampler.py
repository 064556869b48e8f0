"""The GPU engine's sampler with logit_bias, the frequency and presence penalties and token masks (issues 46, 48),
through a decode session: each draw is strata.sampling.sample on the logits the session leaves (engine.logits()),
for a step, a prompt through the prompt path, and each row of step_batch / step_rows with its own settings, in the
uncaptured mode and a captured one; logprobs under a mask are strata.sampling.log_probabilities'; a session without
them steps bit for bit as one whose settings are neutral; a verification part never computes its row's mask; and
structured output end to end on the GPU engine (JSON schemas through Session)."""

import json
from contextlib import contextmanager

import jsonschema
import numpy as np
import pytest

from strata.errors import InvalidArgument
from strata.options import Mode
from strata.runtime.engine import GpuEngine
from strata.sampling import SamplingParams, TokenMask, log_probabilities, sample

from support.compare import assert_same_bits
from test_prompt_path import loaded, prompt_ids, staging  # noqa: F401 (loaded: a fixture)
from test_step_rows import engine

pytestmark = pytest.mark.gpu

MODES = [Mode.UNCAPTURED, Mode.TOKEN_GRAPH]


class Tracked:
    """An engine and the ids it holds (the penalties' history, which the reference needs as the device has it)."""

    def __init__(self, e):
        self.engine, self.ids = e, []

    def draw(self, new, params, u):
        self.ids += list(new)
        return self.engine.feed(list(new), params, u, list(self.ids))

    def want(self, params, u):
        return sample(self.engine.logits(), params, u, self.ids)


@contextmanager
def tracked(model, mode):
    """A Tracked engine of the session's own staging in `mode`, closed on exit."""
    e = Tracked(engine(model, staging(model), mode))
    try:
        yield e
    finally:
        e.engine.close()


def settings(rng, vocab, answer_start):
    """One draw's settings of each kind, greedy and sampled."""
    mask = TokenMask.allowing(np.flatnonzero(rng.random(vocab) < 0.3), vocab)
    bias = {int(t): float(b) for t, b in zip(rng.choice(vocab, 20, replace=False), rng.uniform(-5, 5, 20))}
    kinds = [dict(token_mask=mask), dict(logit_bias=bias),
             dict(frequency_penalty=1.3, presence_penalty=0.6, answer_start=answer_start),
             dict(token_mask=mask, logit_bias=bias, frequency_penalty=0.5, answer_start=answer_start)]
    return [SamplingParams(**filters, **kind) for kind in kinds
            for filters in ({}, dict(temperature=0.8, top_k=40, top_p=0.95, repeat_penalty=1.1))]


@pytest.mark.parametrize("mode", MODES)
def test_each_draw_is_the_references_on_the_sessions_logits(loaded, mode, rng):
    name, model = loaded
    vocab = model.info.geometry.n_vocab
    with tracked(model, mode) as e:
        prompt = prompt_ids(model, rng, 13)  # through the prompt path, then one id per step
        every = settings(rng, vocab, len(prompt))
        u = float(rng.random())
        token = e.draw(prompt, every[-1], u)
        assert token == e.want(every[-1], u), f"{name} {mode}: the prompt's draw"
        for i in range(2 * len(every)):
            params, u = every[i % len(every)], float(rng.random())
            got = e.draw([token], params, u)
            assert got == e.want(params, u), f"{name} {mode} step {i}: {params}"
            if params.token_mask is not None:
                logits = e.engine.logits()
                lp, top = e.engine.logprobs(got, 5, params.token_mask)
                want_lp, want_top = log_probabilities(logits, got, 5, params.token_mask)
                assert abs(lp - want_lp) < 1e-6 and [t for t, _ in top] == [t for t, _ in want_top]
                np.testing.assert_allclose([v for _, v in top], [v for _, v in want_top], atol=1e-6)
            token = got


@pytest.mark.parametrize("mode", MODES)
def test_one_allowed_token_is_always_drawn_and_a_bias_of_minus_100_never(loaded, mode, rng):
    _, model = loaded
    vocab = model.info.geometry.n_vocab
    with tracked(model, mode) as e:
        token = e.draw(prompt_ids(model, rng, 9), SamplingParams(), 0.0)
        for _ in range(6):
            only = int(rng.integers(vocab))
            hot = SamplingParams(temperature=1.5, token_mask=TokenMask.allowing([only], vocab))
            assert e.draw([token], hot, float(rng.random())) == only
            banned = SamplingParams(logit_bias={only: -100.0})
            token = e.draw([only], banned, 0.0)
            assert token != only and token == e.want(banned, 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_batched_rows_each_take_their_own_settings(loaded, mode, rng):
    """step_batch of a masked, a biased and penalised, and a plain session: each row's token is the reference's on
    its logits, and token and logits are what the same session gives in a batch of one, bit for bit."""
    _, model = loaded
    vocab = model.info.geometry.n_vocab
    together, apart = staging(model), staging(model)
    rows = [Tracked(engine(model, together, mode)) for _ in range(3)]
    twins = [Tracked(engine(model, apart, mode)) for _ in range(3)]
    try:
        tokens = []
        for a, b in zip(rows, twins):
            prompt = prompt_ids(model, rng, 11)
            tokens.append(a.draw(prompt, SamplingParams(), 0.0))
            b.draw(prompt, SamplingParams(), 0.0)
        for step in range(4):
            mask = TokenMask.allowing(np.flatnonzero(rng.random(vocab) < 0.2), vocab)
            params = [SamplingParams(temperature=0.9, token_mask=mask),
                      SamplingParams(logit_bias={tokens[1]: -3.0}, frequency_penalty=1.0, presence_penalty=0.5,
                                     answer_start=11),
                      SamplingParams(temperature=0.7, top_k=30)]
            us = [float(u) for u in rng.random(3)]
            for r, t in zip(rows, tokens):
                r.ids.append(t)
            got = GpuEngine.step_batch([r.engine for r in rows], tokens, params, us, [list(r.ids) for r in rows])
            for i, (a, b) in enumerate(zip(rows, twins)):
                assert got[i] == a.want(params[i], us[i]), f"{mode} step {step} row {i}"
                b.ids.append(tokens[i])
                alone = GpuEngine.step_batch([b.engine], [tokens[i]], [params[i]], [us[i]], [list(b.ids)])[0]
                assert alone == got[i]
                assert_same_bits(a.engine.logits(), b.engine.logits(), f"{mode} step {step} row {i}")
            tokens = got
    finally:
        for r in rows + twins:
            r.engine.close()


class Untouchable(TokenMask):
    """A mask whose words must never be computed (a verification row's: the session applies it on the host)."""

    def __init__(self, vocab):
        super().__init__(size=-(-vocab // 32), compute=self._refuse)

    @staticmethod
    def _refuse(out):
        raise AssertionError("a verification part computed its row's token mask")


def test_step_rows_masks_its_plain_parts_and_never_its_verifications(loaded, rng):
    _, model = loaded
    vocab = model.info.geometry.n_vocab
    staged = staging(model)
    verifier, stepper = Tracked(engine(model, staged, Mode.TOKEN_GRAPH)), Tracked(engine(model, staged,
                                                                                          Mode.TOKEN_GRAPH))
    try:
        verifier.draw(prompt_ids(model, rng, 10), SamplingParams(), 0.0)
        token = stepper.draw(prompt_ids(model, rng, 12), SamplingParams(), 0.0)
        only = int(rng.integers(vocab))
        ids = [[int(t) for t in rng.integers(0, vocab, 3)], [token]]
        verifier.ids += ids[0]
        stepper.ids += ids[1]
        params = [SamplingParams(token_mask=Untouchable(vocab)),
                  SamplingParams(temperature=1.0, token_mask=TokenMask.allowing([only], vocab))]
        got = GpuEngine.step_rows([verifier.engine, stepper.engine], ids, [True, False], params, [0.0, 0.5],
                                  [list(verifier.ids), list(stepper.ids)])
        assert got[0].shape == (3, vocab) and got[1] == only
    finally:
        verifier.engine.close()
        stepper.engine.close()


@pytest.mark.parametrize("mode", MODES)
def test_neutral_settings_step_bit_for_bit_as_none(loaded, mode, rng):
    """A zero bias and a mask allowing every token take the flagged paths; tokens and logits stay the plain ones."""
    _, model = loaded
    vocab = model.info.geometry.n_vocab
    plain, flagged = Tracked(engine(model, staging(model), mode)), Tracked(engine(model, staging(model), mode))
    neutral = SamplingParams(logit_bias={3: 0.0}, token_mask=TokenMask.allowing(range(vocab), vocab))
    try:
        prompt = prompt_ids(model, rng, 12)
        a, b = plain.draw(prompt, SamplingParams(), 0.0), flagged.draw(prompt, neutral, 0.0)
        for step in range(6):
            assert a == b, f"{mode} step {step}"
            assert_same_bits(plain.engine.logits(), flagged.engine.logits(), f"{mode} step {step}")
            a, b = plain.draw([a], SamplingParams(), 0.0), flagged.draw([b], neutral, 0.0)
    finally:
        plain.engine.close()
        flagged.engine.close()


def test_a_mask_allowing_nothing_is_refused_and_leaves_the_session_as_it_was(loaded, rng):
    _, model = loaded
    vocab = model.info.geometry.n_vocab
    with tracked(model, Mode.TOKEN_GRAPH) as e:
        token = e.draw(prompt_ids(model, rng, 9), SamplingParams(), 0.0)
        position = e.engine.position
        with pytest.raises(InvalidArgument, match="allows no token"):
            e.engine.feed([token], SamplingParams(token_mask=TokenMask(np.zeros(-(-vocab // 32), np.int32))), 0.0,
                          e.ids + [token])
        with pytest.raises(InvalidArgument, match="outside the"):
            e.engine.feed([token], SamplingParams(logit_bias={vocab: 1.0}), 0.0, e.ids + [token])
        assert e.engine.position == position
        assert e.draw([token], SamplingParams(), 0.0) == e.want(SamplingParams(), 0.0)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": -9, "maximum": 9}}}


def test_json_schema_answers_on_the_gpu_engine_parse_and_validate(tiny_model):
    pytest.importorskip("llguidance")
    import strata

    with strata.load(tiny_model("qwen3next", seed=4), progress=False) as model:
        with model.session(512) as session:
            for seed in (None, 1, 2, 3):
                options = {} if seed is None else dict(temperature=1.0, seed=seed, frequency_penalty=0.3)
                answer = session.complete("Write it down:", 200, json_schema=SCHEMA, logprobs=2, **options)
                jsonschema.validate(json.loads(answer.text), SCHEMA)
                assert answer.finish_reason == "eos", answer  # the grammar complete: only EOS was allowed
