"""A decode step's token mask computed while the device runs the step (issue 46; docs/structured.md, "Where it
runs"), on the GPU: under a JSON schema, greedy and sampled answers are token for token the synchronous path's
(GpuEngine.defer_masks off), in all three modes, with the mask published at once and late (the sampler waiting for
it), every expert in VRAM and every expert on the pool; the mask words are poisoned before every step, so a sampler
that read them before they were published would draw from the poison. A mask whose computation raises or that allows
nothing raises what the synchronous path raises, its token fed and the session going on from there; a mask never
published raises the native timeout within its bound and the engine goes on."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

import strata
from strata.errors import StrataError
from strata.generation import Session
from strata.generation.arguments import OptionRefused
from strata.options import Mode
from strata.runtime.engine import GpuEngine
from strata.sampling import SamplingParams, TokenMask

from support.native_session import open_native_session
from test_prompt_path import rows_of

pytestmark = pytest.mark.gpu

CONTEXT = 256
TOKENS = 72  # each answer's, cut at max_tokens: the schema asks for more
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 40}
PROMPT = [11, 12, 13, 14, 15]
MODES = [Mode.UNCAPTURED, Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH]
POISON_TOKEN = 0  # the byte 0x00, which no JSON outside a string takes: drawn from the poison, the grammar refuses it


@pytest.fixture(scope="module", params=[("qwen3next", "auto"), ("qwen4exp", 0)], ids=["vram", "pool"])
def model(request, tiny_model):
    """A tiny model with every expert in VRAM (the case the mask costs most in), and one (with PLE) with every
    expert on the pool (rings before the sampler)."""
    arch, cache = request.param
    with strata.load(tiny_model(arch, seed=4), progress=False, expert_cache=cache) as loaded:
        yield loaded


class Poisoned(GpuEngine):
    """A GPU engine that poisons the mask words before every feed, and hands the step each mask made lazily as one
    computed `late` seconds late (so the device is waiting for it), recording the threads the masks were computed on;
    `failure` ("raises", "allows nothing") at the `fail_at`-th such mask."""

    def __init__(self, *args, late=0.0, failure=None, fail_at=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.late, self.failure, self.fail_at = late, failure, fail_at
        self.threads: list[str] = []

    def feed(self, ids, params, u, seen):
        words = self.native.token_mask_words()
        words[:] = 0
        words[POISON_TOKEN // 32] = 1 << (POISON_TOKEN % 32)
        mask = params.token_mask
        if mask is not None and not mask.computed:
            params = replace(params, token_mask=TokenMask(size=mask.size, compute=lambda out: self._fill(mask, out)))
        return super().feed(ids, params, u, seen)

    def _fill(self, mask, out):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.late)
        if len(self.threads) == self.fail_at and self.failure == "raises":
            raise OptionRefused("json_schema", "json_schema: the grammar engine cannot go on: made up")
        mask.fill(out)
        if len(self.threads) == self.fail_at and self.failure == "allows nothing":
            out[:] = 0


def session_of(model, mode, defer, timeout=5.0, **options):
    native = open_native_session(model, context=CONTEXT, mode=mode, cache=model.cache, timeout=timeout)
    return Session(Poisoned(native, rows_of(model), defer_masks=defer, **options), model.tokenizer)


def answer(session, **options):
    return [p.token for p in session.generate(PROMPT, max_tokens=TOKENS, json_schema=SCHEMA, **options)]


@pytest.mark.parametrize("late", [0.0, 0.004], ids=["at once", "late"])
@pytest.mark.parametrize("draw", ["greedy", "sampled"])
@pytest.mark.parametrize("mode", MODES)
def test_deferred_masks_draw_the_synchronous_paths_tokens(model, mode, draw, late):
    options = {"temperature": 0.0} if draw == "greedy" else {"temperature": 0.9, "top_k": 40, "seed": 7}
    tokens = {}
    for defer in (False, True):
        session = session_of(model, mode, defer, late=late)
        try:
            tokens[defer] = answer(session, **options)
            assert session.stats.finish_reason == "length", (defer, session.stats)
            where = session.engine.threads
            assert len(where) >= TOKENS - 2 and set(where) == ({"strata-mask"} if defer else {"MainThread"})
        finally:
            session.engine.close()
    assert len(tokens[True]) == TOKENS and tokens[True] == tokens[False], f"{mode} {draw} late {late}"


@pytest.mark.parametrize("failure", ["raises", "allows nothing"])
@pytest.mark.parametrize("mode", [Mode.UNCAPTURED, Mode.TOKEN_GRAPH])
def test_a_failed_mask_raises_as_the_synchronous_path_and_the_session_goes_on(model, mode, failure):
    raised, held = {}, {}
    for defer in (False, True):
        session = session_of(model, mode, defer, failure=failure, fail_at=5)
        try:
            with pytest.raises(StrataError) as error:
                answer(session, temperature=0.0)
            raised[defer] = (type(error.value), str(error.value).split(" (")[0])  # less the native file:line
            engine = session.engine
            # deferred: the failed draw's token was fed (its step ran); synchronous: it is still pending
            assert engine.position == len(session.tokens) - (0 if defer else 1)
            held[defer] = list(session.tokens)
            more = [p.token for p in session.generate([21, 22], max_tokens=8, temperature=0.0, ignore_eos=True)]
            assert len(more) == 8 and engine.position == len(session.tokens) - 1
            fresh = session_of(model, mode, False)  # the same sequence fed afresh: the same answer
            try:
                again = fresh.complete(held[defer] + [21, 22], 8, temperature=0.0, ignore_eos=True)
                assert list(again.tokens) == more, defer
            finally:
                fresh.engine.close()
        finally:
            session.engine.close()
    assert raised[True] == raised[False]
    assert held[True] == held[False]  # the failed draw's token: fed (deferred) or pending (synchronous)


class LosesPublications:
    """A native session whose mask publications are lost while `lost`: its sampler waits out the timeout."""

    def __init__(self, native):
        self._native, self.lost = native, False

    def __getattr__(self, name):
        return getattr(self._native, name)

    def publish_token_mask(self, ticket):
        if not self.lost:
            self._native.publish_token_mask(ticket)


@pytest.mark.parametrize("mode", [Mode.UNCAPTURED, Mode.TOKEN_GRAPH])
def test_a_mask_never_published_raises_the_native_timeout_within_its_bound_and_the_engine_goes_on(model, mode):
    vocab = model.info.geometry.n_vocab
    native = LosesPublications(open_native_session(model, context=CONTEXT, mode=mode, cache=model.cache,
                                                   timeout=0.2))
    engine = GpuEngine(native, rows_of(model))
    only = 77

    def lazy():
        return TokenMask(size=-(-vocab // 32), compute=lambda out: out.__setitem__(
            slice(None), TokenMask.allowing([only], vocab).words))

    try:
        ids = list(PROMPT)
        engine.feed(ids, SamplingParams(), 0.0, ids)
        ids.append(1)
        assert engine.feed([1], SamplingParams(token_mask=lazy()), 0.0, ids) == only  # published: drawn under it
        native.lost = True
        ids.append(2)
        start = time.perf_counter()
        with pytest.raises(StrataError, match=r"the token mask of draw 2 was not published within 0\.2"):
            engine.feed([2], SamplingParams(token_mask=lazy()), 0.0, ids)
        assert time.perf_counter() - start < 2.0
        assert engine.position == len(ids)  # the token was fed
        native.lost = False
        ids.append(3)
        assert engine.feed([3], SamplingParams(temperature=1.0, token_mask=lazy()), 0.5, ids) == only
        ids.append(only)
        plain = engine.feed([only], SamplingParams(), 0.0, ids)
        assert 0 <= plain < vocab and np.isfinite(engine.logits()).all()
    finally:
        engine.close()
