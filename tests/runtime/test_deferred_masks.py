"""A decode step's token mask computed while the device runs the step (GpuEngine.defer_masks, docs/structured.md
"Where it runs"), on the CPU over a fake native session whose sampler waits for the mask's ticket as the device's
does: the mask computed on the engine's worker thread, each draw's ticket new; the synchronous path kept for given
masks, feeds of several ids and with the switch off; a mask that raises or allows nothing published all the same
(the sampler never waits out its timeout), the step's token fed, the error the synchronous path's; a mask published
too late raising the native timeout; a Session's history kept as the engine holds it after such an error; the
worker's thread ended by close() or with its engine."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from strata.errors import InvalidArgument, StrataError
from strata.generation import Session
from strata.generation.arguments import OptionRefused
from strata.runtime.engine import MAX_TICKET, GpuEngine
from strata.runtime.mask_worker import MaskWorker
from strata.runtime.ple_rows import PleRows
from strata.sampling import SamplingParams, TokenMask
from test_engine import FakeDecodeSession, tiny_qwen4exp  # noqa: F401 (a fixture)

VOCAB = 512
WORDS = VOCAB // 32


def lazy(allowed=(3, 40), log=None, fail=None):
    """A mask made lazily, as a constraint makes it: allowing `allowed`; recording the thread it is computed on into
    `log`; raising `fail` instead where given."""
    def compute(out):
        if log is not None:
            log.append(threading.current_thread())
        if fail is not None:
            raise fail
        out[:] = TokenMask.allowing(allowed, VOCAB).words

    return TokenMask(size=WORDS, compute=compute)


class Fed:
    """An engine over a fake native session and the ids it was fed (its `seen`)."""

    def __init__(self, **options):
        self.native = FakeDecodeSession(n_vocab=VOCAB, timeout=options.pop("timeout", 5.0))
        self.engine = GpuEngine(self.native, **options)
        self.ids: list[int] = []

    def feed(self, ids, mask=None, **params):
        self.ids += ids
        return self.engine.feed(ids, SamplingParams(token_mask=mask, **params), 0.5, list(self.ids))


def test_a_lazy_mask_is_computed_on_the_worker_while_the_step_waits_for_each_draws_new_ticket():
    fed, threads = Fed(), []
    try:
        fed.feed([1])
        for i, token in enumerate([7, 8, 9]):
            drawn = fed.feed([token], lazy(log=threads))
            assert drawn in (3, 40) and fed.native.steps[-1][2][-1] == i + 1  # the ticket the step waited for
        assert fed.native.published == [1, 2, 3]
        assert {t.name for t in threads} == {"strata-mask"} and len(set(threads)) == 1  # one long-lived thread
        fed.engine._ticket = MAX_TICKET - 1  # tickets wrap past 2^32 - 1 to 1, never 0 (no ticket)
        fed.feed([10], lazy())
        fed.feed([11], lazy())
        assert fed.native.published[-2:] == [MAX_TICKET, 1]
    finally:
        fed.engine.close()
    assert not threads[0].is_alive()  # close() ends it


@pytest.mark.parametrize("case", ["given words", "several ids", "switched off"])
def test_other_masks_are_computed_before_the_step_without_a_ticket(case):
    fed, threads = Fed(defer_masks=case != "switched off"), []
    try:
        mask = TokenMask.allowing([5], VOCAB) if case == "given words" else lazy([5], log=threads)
        drawn = fed.feed([1, 2] if case == "several ids" else [1], mask)
        assert drawn == 5 and len(fed.native.steps[-1][2]) == 10 and fed.native.published == []
        assert all(t is threading.current_thread() for t in threads)
    finally:
        fed.engine.close()


def synchronous_error(mask_of):
    """What feeding one id raises where its mask (made by `mask_of()`) is computed before the step, and whether the id
    was fed then."""
    fed = Fed(defer_masks=False)
    fed.feed([1])
    with pytest.raises(StrataError) as raised:
        fed.feed([2], mask_of())
    return raised.value, fed.engine.position


@pytest.mark.parametrize("failure", ["compute raises", "allows nothing"])
def test_a_failed_mask_is_published_allowing_every_token_and_raised_after_its_step_as_before(failure):
    def mask_of():
        return lazy(fail=OptionRefused("json_schema", "json_schema: the grammar engine cannot go on")) \
            if failure == "compute raises" else lazy(allowed=())

    before, position = synchronous_error(mask_of)
    assert position == 1  # the synchronous path refuses before the step: nothing fed
    fed = Fed()
    try:
        fed.feed([1])
        with pytest.raises(type(before)) as raised:
            fed.feed([2], mask_of())
        assert str(raised.value) == str(before) and type(raised.value) is type(before)
        assert fed.native.published == [1] and (fed.native.drawn_under == -1).all()  # every token: a defined draw
        assert fed.engine.position == 2  # the deferred path's step ran: its token is fed, its draw void
        assert fed.feed([3], lazy()) in (3, 40) and fed.native.published == [1, 2]  # and the engine goes on
    finally:
        fed.engine.close()


@pytest.mark.parametrize("defer", [False, True])
def test_the_hosts_ngram_state_follows_the_token_fed_or_refused(tiny_qwen4exp, defer):
    """A PLE model's rows gathered on the host: a step refused keeps the n-gram state as it was, a step whose deferred
    mask failed after it fed its token keeps the token's."""
    native = FakeDecodeSession(n_vocab=VOCAB)
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, tiny_qwen4exp.geometry), defer_masks=defer)
    try:
        engine.feed([1, 2], SamplingParams(), 0.0, [1, 2])
        before = engine.ple.previous.copy()
        with pytest.raises(InvalidArgument, match="allows no token"):
            engine.feed([3], SamplingParams(token_mask=lazy(allowed=())), 0.0, [1, 2, 3])
        assert engine.position == (3 if defer else 2)
        fed = PleRows(tiny_qwen4exp, tiny_qwen4exp.geometry)
        for token in [1, 2, 3][:engine.position]:
            fed.rows(token)
        assert np.array_equal(engine.ple.previous, fed.previous) and defer != np.array_equal(before, fed.previous)
    finally:
        engine.close()


class Unpublished(FakeDecodeSession):
    """A native session whose mask publications are lost while `lost`: its sampler waits out the timeout."""

    lost = True

    def publish_token_mask(self, ticket):
        if not self.lost:
            super().publish_token_mask(ticket)


def test_a_mask_never_published_raises_the_native_timeout_once_its_step_has_fed_the_token():
    native = Unpublished(n_vocab=VOCAB, timeout=0.05)
    engine = GpuEngine(native)
    try:
        engine.feed([1], SamplingParams(), 0.0, [1])
        with pytest.raises(StrataError, match="the token mask of draw 1 was not published within 0.05 s"):
            engine.feed([2], SamplingParams(token_mask=lazy()), 0.0, [1, 2])
        assert engine.position == 2
        native.lost = False
        assert engine.feed([3], SamplingParams(token_mask=lazy()), 0.0, [1, 2, 3]) in (3, 40)
        assert native.steps[-1][2][-1] == 2
    finally:
        engine.close()


def test_a_session_holds_what_the_engine_holds_after_a_deferred_draw_fails(tiny_qwen4exp):
    pytest.importorskip("llguidance")
    native = FakeDecodeSession(n_vocab=VOCAB, context=64)
    session = Session(GpuEngine(native), tiny_qwen4exp.tokenizer())
    deferred = []
    real_check = native.check_token_mask

    def check():  # the third mask computed on the worker allows nothing
        if threading.current_thread().name == "strata-mask":
            deferred.append(1)
            if len(deferred) == 3:
                native.token_mask_words()[:] = 0
        real_check()

    native.check_token_mask = check
    try:
        with pytest.raises(InvalidArgument, match="allows no token"):
            list(session.generate([1, 2, 3], max_tokens=20, regex="a{30}"))
        assert session.stats.finish_reason == "error"
        assert len(session.tokens) == session.engine.position == 3 + 3  # the prompt, then three decode steps fed
        assert [s[0] for s in native.steps] == session.tokens
        native.check_token_mask = real_check
        held = session.tokens
        pieces = list(session.generate([4], max_tokens=3, regex="a{30}"))  # goes on from what the session holds
        assert len(pieces) == 3 and session.tokens[:7] == held + [4] and native.resets == 0
        assert [s[0] for s in native.steps] == session.tokens[:-1]  # the last token pending, as after any call
    finally:
        session.engine.close()


def test_a_dropped_worker_ends_its_thread():
    worker = MaskWorker()
    assert worker.submit(threading.current_thread).result().name == "strata-mask"
    thread = worker.submit(threading.current_thread).result()
    del worker
    gc.collect()
    thread.join(5.0)
    assert not thread.is_alive()


def test_a_workers_jobs_run_in_order_and_an_error_is_its_jobs_alone():
    worker = MaskWorker()
    try:
        done = []
        first = worker.submit(lambda: done.append(1))
        failed = worker.submit(lambda: 1 / 0)
        last = worker.submit(lambda: done.append(3) or "ok")
        assert last.result() == "ok" and first.result() is None and done == [1, 3]
        assert isinstance(failed.exception(), ZeroDivisionError)
    finally:
        worker.close()
