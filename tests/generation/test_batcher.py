"""The Batcher: sessions driven through it answer token for token as each alone (prompts of every length, sessions
at other positions, greedy and seeded sampling, stops, one ending early, one cancelled, one joining late); decode
steps are gathered into batched steps of one key only; every engine call runs on its thread; a failure reaches
only the call that made it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

from strata.errors import InvalidArgument, StrataError
from strata.format import inspect
from strata.generation import Session
from strata.generation.batcher import STEPPED_PROMPT_CHUNK, Batcher, prompt_pieces
from strata.generation.draft_length import FixedDraftLength
from strata.generation.drafts import LookupDrafter
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import SamplingParams
from support.batch_engine import AlwaysBatch, BatchingReference, BatchingTable, BatchLog, FailingAt, RowsTable
from support.char_engine import CharCodec

CONTEXT = 128
VOCAB = 96
# A grace long enough that a busy test machine's thread switches do not split batches (the gathering is what is
# checked here, not its timing); members that end or call are never waited for that long.
GRACE = 0.2


@dataclass
class Job:
    """One session's call: `prompt` (a whole sequence, streamed), after `prelude` if given (then continued with
    generate, so the session starts elsewhere); broken off after `cancel_after` tokens; started once the first
    job has had `joins_after` tokens."""

    prompt: str | list[int]
    options: dict = field(default_factory=dict)
    prelude: str | list[int] | None = None
    cancel_after: int | None = None
    joins_after: int | None = None
    drafts: bool = False  # its session drafts by prompt lookup, 3 a verification


def job_session(engine, codec, job: Job, drafter=LookupDrafter) -> Session:
    if job.drafts:
        return Session(engine, codec, drafter(), 3, draft_length=FixedDraftLength(3))
    return Session(engine, codec)


def run_job(session: Session, job: Job, on_token=None) -> list:
    """The job's tokens (with logprobs asked: each token with its logprob and alternatives)."""
    if job.prelude is not None:
        session.complete(job.prelude, max_tokens=3)
        stream = session.generate(job.prompt, **job.options)
    else:
        stream = session.stream(job.prompt, **job.options)
    tokens = []
    try:
        for piece in stream:
            tokens.append(piece.token if piece.logprob is None else (piece.token, piece.logprob, piece.top_logprobs))
            if on_token is not None:
                on_token(len(tokens))
            if job.cancel_after is not None and len(tokens) >= job.cancel_after:
                break
    finally:
        stream.close()
    return tokens


def run_batched(sessions: list[Session], jobs: list[Job]) -> list[list[int]]:
    """Each job on its session (over a member of a batcher), all at once."""
    first_progress = threading.Condition()
    done_by_first = [0]

    def first_token(n: int) -> None:
        with first_progress:
            done_by_first[0] = n
            first_progress.notify_all()

    start = threading.Barrier(sum(job.joins_after is None for job in jobs))

    def work(i: int) -> list[int]:
        job = jobs[i]
        if job.joins_after is not None:
            with first_progress:
                assert first_progress.wait_for(lambda: done_by_first[0] >= job.joins_after, timeout=60)
            with sessions[i].engine.active():
                return run_job(sessions[i], job)
        with sessions[i].engine.active():
            # a first call makes the member one the batcher waits for; the barrier keeps the threads' own start-up
            # on a busy machine from staggering them
            assert sessions[i].engine.position == 0
            start.wait(timeout=60)
            try:
                return run_job(sessions[i], job, first_token if i == 0 else None)
            finally:
                if i == 0:  # an early EOS ends it before the joiner's count: it joins then
                    first_token(1 << 30)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(work, range(len(jobs))))


def random_ids(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return [int(t) for t in rng.integers(1, vocab, n)]


def mixed_jobs(rng: np.random.Generator, vocab: int, stop_prompt: list[int], stop: str) -> list[Job]:
    def ids(n: int) -> list[int]:
        return random_ids(rng, vocab, n)

    seed = int(rng.integers(0, 2**31))
    return [Job(ids(3), {"max_tokens": 24}),                                                # the long one
            Job(ids(4 * STEPPED_PROMPT_CHUNK + 3), {"max_tokens": 10, "temperature": 0.9, "seed": seed}),
            Job(ids(2), {"max_tokens": 3}),                                                 # ends early
            Job(stop_prompt, {"max_tokens": 16, "stop": stop}),
            Job(ids(5), {"max_tokens": 16, "temperature": 1.1, "top_k": 8, "seed": seed + 1}, cancel_after=6),
            Job(ids(2 * STEPPED_PROMPT_CHUNK + 1), {"max_tokens": 8}, prelude=ids(11)),    # elsewhere already
            Job(ids(9), {"max_tokens": 8, "temperature": 0.7, "seed": seed + 2}, joins_after=5)]


def stop_string(codec, make_session, prompt: list[int]) -> str:
    """A stop string the greedy answer to `prompt` meets after a few tokens: the text of a token after its first."""
    tokens = make_session().complete(prompt, max_tokens=6).tokens
    return next((text for t in tokens[1:] if (text := codec.decode([t]).strip())), "")


# a small JSON schema for the structured members of the whole mix
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


def whole_mix(rng: np.random.Generator, vocab: int) -> list[Job]:
    """What the mixed jobs lack: structured output (a regex greedy, a JSON schema sampled), drafts (plain, and under
    a regex), logprobs (sampled)."""
    seed = int(rng.integers(0, 2**31))
    return [Job(random_ids(rng, vocab, 6), {"max_tokens": 12, "regex": "[a-f]{3,9}"}),
            Job(random_ids(rng, vocab, 4), {"max_tokens": 24, "json_schema": SCHEMA, "temperature": 0.8,
                                            "seed": seed}),
            Job(random_ids(rng, vocab, 7), {"max_tokens": 14}, drafts=True),
            Job(random_ids(rng, vocab, 5), {"max_tokens": 10, "regex": "[0-9]{2,6}"}, drafts=True),
            Job(random_ids(rng, vocab, 3), {"max_tokens": 8, "logprobs": 2, "temperature": 0.6, "seed": seed + 1})]


def check_mix(make_engine, codec, rng, vocab: int, batcher: Batcher, whole: bool = False,
              drafter=LookupDrafter) -> list[Session]:
    """The mixed jobs (`whole`: and the whole mix's, drafting with `drafter()`) on sessions over engines of
    `make_engine(batched=False)` alone, and over members of `batcher` (engines of `make_engine(batched=True)`),
    answer alike; the batched sessions."""
    stop_prompt = random_ids(rng, vocab, STEPPED_PROMPT_CHUNK)
    jobs = mixed_jobs(rng, vocab, stop_prompt,
                      stop_string(codec, lambda: Session(make_engine(False), codec), stop_prompt))
    jobs += whole_mix(rng, vocab) if whole else []
    alone = [run_job(job_session(make_engine(False), codec, job, drafter), job) for job in jobs]
    sessions = [job_session(batcher.member(make_engine(True)), codec, job, drafter) for job in jobs]
    together = run_batched(sessions, jobs)
    for i, (a, b) in enumerate(zip(alone, together)):
        assert b == a, f"job {i}: {b} through the batcher, {a} alone"
    assert len(alone[2]) <= 3 and len(alone[4]) <= 6 and len(alone[3]) < 16
    return sessions


# -------------------------------------------------------------------------------------------- the tests


def test_prompt_pieces_chunk_and_keep_a_short_tail_with_the_piece_before():
    assert prompt_pieces(5, 8) == [5]
    assert prompt_pieces(16, 8) == [8, 8]
    assert prompt_pieces(19, 8) == [8, 8, 3]
    assert prompt_pieces(19, 8, whole_below=4) == [8, 11]
    assert prompt_pieces(20, 8, whole_below=4) == [8, 8, 4]
    assert prompt_pieces(3, 2, whole_below=4) == [3]
    for n in range(1, 40):
        for chunk in range(1, 10):
            for whole_below in range(1, 6):
                pieces = prompt_pieces(n, chunk, whole_below)
                assert sum(pieces) == n and all(p >= 1 for p in pieces)
                assert all(p == max(chunk, whole_below) for p in pieces[:-2])
                assert len(pieces) == 1 or min(pieces) >= whole_below


def table_engines(table: np.ndarray, log: BatchLog, key: object = "model", **options):
    return lambda: BatchingTable(table, context=CONTEXT, log=log, batch_key=key, **options)


def alone_and_batched(batcher: Batcher, make_engine, prompts, **options) -> tuple[list, list]:
    """Completions of `prompts`, each on a session of its own alone, and all at once through `batcher`."""
    alone = [list(Session(make_engine(), CharCodec()).complete(p, **options).tokens) for p in prompts]
    together = run_batched([Session(batcher.member(make_engine()), CharCodec()) for _ in prompts],
                           [Job(p, options) for p in prompts])
    return alone, together


@pytest.fixture
def table(rng) -> np.ndarray:
    logits = rng.normal(0, 3, (VOCAB, VOCAB)).astype(np.float32)
    logits[:, 0] = -1e9  # never EOS: every generation runs its max_tokens
    return logits


def test_sessions_through_the_batcher_answer_as_alone_on_a_batching_engine(table, rng):
    log = BatchLog()
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        check_mix(lambda batched: table_engines(table, log if batched else BatchLog())(), CharCodec(), rng, VOCAB,
                  batcher)
    assert log.calls_one_at_a_time_on(batcher.thread_id), "engine calls overlapped, or a batch ran off its thread"
    assert max(log.sizes) > 1


def test_concurrent_greedy_generations_step_together(table, rng):
    log = BatchLog()
    prompts = [random_ids(rng, VOCAB, 4) for _ in range(4)]
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        alone, together = alone_and_batched(batcher, table_engines(table, log), prompts, max_tokens=20)
        stats = batcher.stats()
    assert together == alone
    # every session steps 19 times after its prompt: nearly all in batches of all four
    assert log.sizes.count(4) >= 15, log.sizes
    assert stats["decode_rows"] == 4 * 19 and stats["decode_rows"] / stats["decode_batches"] > 3, stats


def test_engines_of_different_batch_keys_never_step_together(table, rng):
    log = BatchLog()
    keys = iter(["a", "b", "a", "b", None] * 2)
    prompts = [random_ids(rng, VOCAB, 3) for _ in range(5)]
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        alone, together = alone_and_batched(batcher, lambda: table_engines(table, log, next(keys))(), prompts,
                                            max_tokens=12)
    assert together == alone
    assert all(len(set(keys)) == 1 and keys[0] is not None for keys in log.batches)
    assert {keys[0] for keys in log.batches} == {"a", "b"} and max(log.sizes) == 2


def test_batches_keep_to_the_engines_and_the_batchers_limit(table, rng):
    for engine_limit, batcher_limit, largest in ((2, None, 2), (None, 3, 3), (3, 2, 2)):
        log = BatchLog()
        prompts = [random_ids(rng, VOCAB, 3) for _ in range(5)]
        with Batcher(max_batch=batcher_limit, grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
            alone, together = alone_and_batched(batcher, table_engines(table, log, max_batch=engine_limit),
                                                prompts, max_tokens=12)
        assert together == alone
        assert max(log.sizes) == largest, (engine_limit, batcher_limit, log.sizes)


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next", "qwen35moe"])
def model_file(request, tiny_model):
    with inspect(tiny_model(request.param, seed=7)) as file:
        yield file


def test_reference_sessions_through_the_batcher_answer_as_alone(model_file, rng):
    """The reference engine as it is (no batched step: stepped one by one) and with the batched step, the latter
    under the whole mix (structured output, drafts, logprobs too)."""
    codec = model_file.tokenizer()
    vocab = min(model_file.geometry.n_vocab, 200)
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        check_mix(lambda batched: ReferenceEngine(Reference(model_file), CONTEXT), codec, rng, vocab, batcher)
    log = BatchLog()
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        check_mix(lambda batched: BatchingReference(Reference(model_file), CONTEXT, log=log if batched else BatchLog()),
                  codec, rng, vocab, batcher, whole=True)
    assert log.calls_one_at_a_time_on(batcher.thread_id) and max(log.sizes) > 1


def test_a_long_prompt_advances_a_chunk_per_decode_batch(table, rng):
    """With no stall allowed (decode_stall_seconds 0): one chunk, then one decode batch: a decoding session steps
    between every two chunks of another's prompt, and the prompt advances while it decodes."""
    log = BatchLog()
    prompt = random_ids(rng, VOCAB, 5 * STEPPED_PROMPT_CHUNK + 3)
    # the decoder runs long enough to be decoding throughout the prompt, however late the prompt's thread wakes: its
    # steps take a millisecond each (alone, they run on its own thread, as fast as the table answers)
    jobs = [Job(random_ids(rng, VOCAB, 3), {"max_tokens": CONTEXT - 8}), Job(prompt, {"max_tokens": 3}, joins_after=5)]
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch(), decode_stall_seconds=0.0) as batcher:
        engines = [SlowTable(table, context=CONTEXT, log=log, batch_key="model"), table_engines(table, log)()]
        run_batched([Session(batcher.member(e), CharCodec()) for e in engines], jobs)
    decoder, prompted = engines
    chunks = [i for i, (engine, _, n) in enumerate(log.calls) if engine is prompted and n > 1]
    assert [log.calls[i][1:] for i in chunks] == [("prefill", STEPPED_PROMPT_CHUNK)] * 5 + [("feed", 3)]
    for before, after in zip(chunks, chunks[1:]):
        between = [call for engine, *call in log.calls[before + 1:after] if engine is decoder]
        assert between == [["feed", 1]], (before, after, between)


class SlowTable(BatchingTable):
    """A BatchingTable whose every feed takes at least a millisecond."""

    def feed(self, ids, params, u, seen):
        time.sleep(0.001)
        return super().feed(ids, params, u, seen)


def test_an_active_member_busy_elsewhere_holds_the_others_back_a_grace_per_step_at_most(table, rng):
    grace, steps = 0.01, 20
    with Batcher(grace_seconds=grace, policy=AlwaysBatch()) as batcher:
        idle = Session(batcher.member(table_engines(table, BatchLog())()), CharCodec())
        busy = Session(batcher.member(table_engines(table, BatchLog())()), CharCodec())
        with idle.engine.active():
            idle.complete([1, 2], max_tokens=1)  # it has called: it is waited for, and now makes no more calls
            start = time.monotonic()
            busy.complete([3, 4], max_tokens=steps + 1)
            seconds = time.monotonic() - start
    assert grace * steps / 2 <= seconds < 1.0 + grace * steps, seconds  # it waited, a grace per step


class GreedyDrafts:
    """The table's greedy path, its second draft wrong at some lengths: windows taken whole and cut short."""

    def __init__(self, table: np.ndarray):
        self.table = table

    def propose(self, history, k):
        drafts = [int(history[-1])]
        for _ in range(k):
            drafts.append(int(np.argmax(self.table[drafts[-1]])))
        return [1 + t % (VOCAB - 1) if len(history) % 3 == 0 and i == 1 else t for i, t in enumerate(drafts[1:])]


def drafting_or_plain(engine, table: np.ndarray, i: int) -> Session:
    """Session i of the drafting tests: the second a plain one beside the others, which draft 3 a verification."""
    if i == 1:
        return Session(engine, CharCodec())
    return Session(engine, CharCodec(), GreedyDrafts(table), 3, draft_length=FixedDraftLength(3))


def test_drafted_sessions_verify_alone_and_answer_as_alone(table, rng):
    """A drafting session's verifies and truncates run alone beside the others' gathered steps."""
    log = BatchLog()
    prompts = [random_ids(rng, VOCAB, n) for n in (5, 4, 11)]

    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        alone = [list(drafting_or_plain(table_engines(table, BatchLog())(), table, i).complete(p, max_tokens=16).tokens)
                 for i, p in enumerate(prompts)]
        sessions = [drafting_or_plain(batcher.member(table_engines(table, log)()), table, i)
                    for i in range(len(prompts))]
        together = run_batched(sessions, [Job(p, {"max_tokens": 16}) for p in prompts])
    assert together == alone
    assert log.calls_one_at_a_time_on(batcher.thread_id)
    assert sessions[0].stats.accepted > 0 and sessions[0].stats.accepted < sessions[0].stats.drafted


@pytest.mark.parametrize("max_batch", [None, 5])
def test_drafted_sessions_verify_together_with_the_others_steps_where_the_engine_steps_rows(table, rng, max_batch):
    """With step_rows, a drafting session's verification is gathered with the others' steps and verifications into
    one step of their rows (at most max_batch rows), and every answer is its session's alone."""
    log = BatchLog()
    prompts = [random_ids(rng, VOCAB, n) for n in (5, 4, 11, 7)]

    def rows_engine(log_to):
        return RowsTable(table, context=CONTEXT, log=log_to, batch_key="model", max_batch=max_batch)

    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        alone = [list(drafting_or_plain(rows_engine(BatchLog()), table, i).complete(p, max_tokens=16).tokens)
                 for i, p in enumerate(prompts)]
        sessions = [drafting_or_plain(batcher.member(rows_engine(log)), table, i) for i in range(len(prompts))]
        together = run_batched(sessions, [Job(p, {"max_tokens": 16}) for p in prompts])
        stats = batcher.stats()
    assert together == alone
    assert log.calls_one_at_a_time_on(batcher.thread_id)
    assert any(len(parts) > 1 and max(parts) > 1 for parts in log.rows), log.rows  # a verify beside other rows
    if max_batch is not None:
        assert max(sum(parts) for parts in log.rows) <= max_batch, log.rows
    assert stats["decode_rows"] == sum(stats["batch_sizes"][r] * r for r in stats["batch_sizes"]), stats
    assert sessions[0].stats.accepted > 0 and sessions[0].stats.accepted < sessions[0].stats.drafted


def test_a_failing_call_reaches_only_its_member(table, rng):
    log = BatchLog()
    prompts = [random_ids(rng, VOCAB, 3) for _ in range(4)]
    engines = [table_engines(table, log)(), FailingAt(table, context=CONTEXT, log=log, batch_key=None, fail_at=8),
               table_engines(table, log)(), FailingAt(table, context=CONTEXT, log=log, batch_key="other", fail_at=6)]
    errors: dict[int, BaseException] = {}
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        sessions = [Session(batcher.member(engine), CharCodec()) for engine in engines]

        def work(i: int) -> list[int]:
            with sessions[i].engine.active():
                try:
                    return list(sessions[i].complete(prompts[i], max_tokens=16).tokens)
                except ValueError as error:
                    errors[i] = error
                    return []

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(4)))
    assert sorted(errors) == [1, 3]
    assert str(errors[1]) == "engine failed at 8" and str(errors[3]) == "engine failed at 6"
    for i in (0, 2):
        assert results[i] == list(Session(table_engines(table, BatchLog())(), CharCodec()).complete(
            prompts[i], max_tokens=16).tokens)


def test_other_calls_reach_the_engine_on_the_thread_and_closing_refuses_more(table):
    log = BatchLog()
    batcher = Batcher()
    member = batcher.member(table_engines(table, log)())
    assert member.context == CONTEXT and member.verify_rows == 8 and member.batch_key == "model"
    assert hasattr(member, "logprobs") and hasattr(member, "verify") and not hasattr(member, "snapshot")
    assert not hasattr(member, "prompt_chunk")
    session = Session(member, CharCodec())
    done = session.complete([5, 6, 7], max_tokens=4, logprobs=2)
    assert all(len(p.top_logprobs) == 2 for p in done.pieces)
    assert member.position == 3 + 3
    with pytest.raises(InvalidArgument, match="verify takes"):
        member.verify([], [])
    batcher.close()
    # the other calls ran on the batcher's thread, the lone decode steps on this one (nothing to gather them with)
    assert log.calls_one_at_a_time_on(batcher.thread_id) and log.threads == {batcher.thread_id, threading.get_ident()}
    with pytest.raises(StrataError, match="batcher is closed"):
        member.feed([1], None, 0.0, [])
    counts = batcher.stats()
    assert counts["decode_rows"] == 3 and counts["calls"] >= 4, counts


def test_a_members_hook_runs_before_every_engine_call_and_its_error_fails_its_own_next_call(table):
    """A member's before_compute runs before the other members' engine calls too (the server's events of a prompt's
    first token go out while other prompts run, not at the member's own next call); what it raises there does not
    fail the other member's call but the member's own next one, once."""
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        quiet, busy = (batcher.member(table_engines(table, BatchLog())()) for _ in range(2))
        ran = []
        quiet.before_compute = lambda: ran.append(threading.get_ident())
        talker = Session(busy, CharCodec())
        talker.complete([5, 6, 7], max_tokens=4)
        assert len(ran) >= 4  # the prompt and the decode steps: each call of the other member's

        def broken() -> None:
            raise StrataError("the stream is gone")

        quiet.before_compute = broken
        assert len(talker.complete([1, 2], max_tokens=3).tokens) == 3  # not failed by it
        quiet.before_compute = None
        with pytest.raises(StrataError, match="the stream is gone"):
            quiet.feed([3, 4, 5], SamplingParams(), 0.0, [3, 4, 5])
        assert Session(quiet, CharCodec()).complete([3, 4, 5], max_tokens=2).tokens  # once


class SlowSteps(BatchingTable):
    """A BatchingTable whose decode step lets go of the GIL for 2 ms, as the native step does: long enough for a
    woken thread to run."""

    def feed(self, ids, params, u, seen):
        if len(ids) == 1:
            time.sleep(0.002)
        return super().feed(ids, params, u, seen)


def test_a_lone_members_inline_steps_leave_the_compute_thread_asleep(table):
    """A decode step run on its caller's thread gives the compute thread nothing to do, so it is not woken (each
    wake takes the GIL while the step runs, and a core beside it); what was queued meanwhile still wakes it."""
    log = BatchLog()
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        member = batcher.member(SlowSteps(table, context=CONTEXT, log=log))
        wakes, wait, compute = [0], batcher._cond.wait, batcher.thread_id

        def counted(timeout=None):
            woken = wait(timeout)
            wakes[0] += threading.get_ident() == compute
            return woken

        batcher._cond.wait = counted
        with member.active():
            tokens = list(Session(member, CharCodec()).complete([5, 6, 7], max_tokens=8).tokens)
        inline = batcher.stats()["inline_steps"]
    assert len(tokens) == 8
    assert inline == 7 and wakes[0] <= 2, (inline, wakes)  # the prompt's call wakes it, and its end


def test_the_batcher_steps_alone_where_its_policy_finds_batches_dearer(table, rng):
    """The default, measuring policy told that a lone step of this key costs far less than any batch: four
    concurrent greedy generations then step one by one, and still answer as alone."""
    log = BatchLog()
    prompts = [random_ids(rng, VOCAB, 4) for _ in range(4)]
    with Batcher(grace_seconds=GRACE) as batcher:
        for rows in range(2, 5):
            batcher.policy.record((BatchingTable, "model"), rows, 1.0)
        batcher.policy.record((BatchingTable, "model"), 1, 1e-9)
        alone, together = alone_and_batched(batcher, table_engines(table, log), prompts, max_tokens=12)
    assert together == alone
    assert log.sizes == []  # no step_batch: every step alone


def test_a_lone_members_decode_steps_run_on_its_own_thread(table):
    """A decode step with nothing to gather it with (its member the only one active, nothing queued) runs on its
    caller's thread, the answer the same; the compute thread still runs the prompt and the other calls."""
    log = BatchLog()
    with Batcher(grace_seconds=GRACE, policy=AlwaysBatch()) as batcher:
        member = batcher.member(table_engines(table, log)())
        with member.active():
            tokens = list(Session(member, CharCodec()).complete([5, 6, 7], max_tokens=6).tokens)
        stats = batcher.stats()
    assert tokens == list(Session(table_engines(table, BatchLog())(), CharCodec()).complete([5, 6, 7],
                                                                                          max_tokens=6).tokens)
    assert stats["inline_steps"] == stats["decode_batches"] == 5  # the first token comes with the prompt
    assert log.calls_one_at_a_time_on(batcher.thread_id)
    assert log.threads == {batcher.thread_id, threading.get_ident()}
