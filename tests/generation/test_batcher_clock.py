"""The Batcher timed by a scripted clock (support.batch_engine.ScriptedClock: seconds pass only as engines with
stated costs compute, so nothing here depends on the machine's speed): a step that came while a batch ran is gathered
with that batch's members rather than stepped alone; members that cannot join a batch are not waited for; prompt
chunks and decode batches interleave within the stated bounds; the measuring policy is never slower than taking
turns; and every session answers as alone under the whole mix."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from strata.format import inspect
from strata.generation import Session
from strata.generation.batch_policy import REPROBE_AFTER
from strata.generation.batcher import Batcher
from strata.sampling import SamplingParams
from support.batch_engine import AlwaysBatch, BatchingTable, BatchLog, CostedTable, Costs, ScriptedClock
from support.char_engine import CharCodec
from test_batcher import check_mix, random_ids

CONTEXT = 128
VOCAB = 96
GREEDY = SamplingParams(temperature=0.0)
WATCHDOG = 60.0  # seconds a test's threads get to finish; only a batcher that waits for nothing passes

# the GPU box's step with every expert in VRAM (2026-12-06): 2.5 ms alone, a batch 1.9 + 0.88 ms a row; prompt
# pieces at 10,000 tokens a second
VRAM = Costs(lone=2.5e-3, batch=lambda n: 1.9e-3 + 0.88e-3 * n, prompt=lambda n: 1.9e-3 + 0.1e-3 * n)
# a batch dearer than its rows alone at every size (the experts on the CPU, 2026-12-03, at its worst)
LOSING = Costs(lone=9.4e-3, batch=lambda n: 9.4e-3 * 1.1 * n, prompt=lambda n: 5e-3 + 0.5e-3 * n)


@pytest.fixture
def table(rng) -> np.ndarray:
    logits = rng.normal(0, 3, (VOCAB, VOCAB)).astype(np.float32)
    logits[:, 0] = -1e9  # never EOS
    return logits


def costed(table, clock, log, costs=VRAM, key="model", **options) -> CostedTable:
    return CostedTable(table, context=CONTEXT, log=log, batch_key=key, clock=clock, costs=costs, **options)


def finished(threads: list[threading.Thread]) -> bool:
    deadline = time.monotonic() + WATCHDOG
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def stepper(member, first: int, steps: int, errors: list, before=None):
    """A thread that makes `member` active, calls `before`, and steps it `steps` times greedily from token `first`
    (a member is waited for from its first call after it began: a `before` that calls it and waits at a barrier
    starts the members together)."""
    def run() -> None:
        try:
            with member.active():
                if before is not None:
                    before()
                token, seen = first, []
                for _ in range(steps):
                    seen = [*seen, token]
                    token = member.feed([token], GREEDY, 0.0, seen)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)
    return threading.Thread(target=run, daemon=True)


def test_a_step_that_came_while_a_batch_ran_is_gathered_with_its_members_not_stepped_alone(table):
    """X's first step comes while A and B's batch runs, and that batch outlasts the grace: X then waits for A and B
    (the grace counts from the batch's end), and the three step together from there on. Counted from X's arrival,
    X would step alone after every batch of the two, and they after it, for good."""
    clock, log, steps = ScriptedClock(), BatchLog(), 6
    slow = Costs(lone=5.0, batch=lambda n: 4.0 + n, prompt=lambda n: 5.0)  # every call outlasts the grace
    during = threading.Event()
    with Batcher(grace_seconds=1.0, policy=AlwaysBatch(), clock=clock) as batcher:
        a, b, x = (batcher.member(costed(table, clock, log, slow)) for _ in range(3))

        class Hold(CostedTable):
            """The first batch of A and B waits, before its clock moves, until X's step is in."""

            @staticmethod
            def step_batch(engines, ids, params, us, seens):
                if not during.is_set():
                    during.set()
                    deadline = time.monotonic() + WATCHDOG
                    while not any(c.member is x for c in batcher._steps):  # X's step is in the batcher's queue
                        assert time.monotonic() < deadline
                        time.sleep(0.001)
                return CostedTable.step_batch(engines, ids, params, us, seens)

        for member in (a, b, x):
            member.engine.__class__ = Hold
        errors: list = []
        gate = threading.Barrier(2)
        threads = [stepper(a, 1, steps, errors, before=lambda: (a.position, gate.wait(WATCHDOG))),
                   stepper(b, 2, steps, errors, before=lambda: (b.position, gate.wait(WATCHDOG))),
                   stepper(x, 3, steps, errors, before=lambda: during.wait(WATCHDOG))]
        for thread in threads:
            thread.start()
        assert finished(threads) and not errors, errors
    assert log.sizes == [2] + [3] * (steps - 1), log.sizes  # and X's last step alone


@pytest.mark.parametrize("other", ["no batch key", "another key", "batches lose"])
def test_members_that_cannot_join_the_batch_are_not_waited_for(table, other):
    """An active member that has called and is busy elsewhere holds back only the batches it could join: on the
    scripted clock the grace never runs out, so a batch that waited for it would wait for ever."""
    clock, log, steps = ScriptedClock(), BatchLog(), 8
    key = {"no batch key": None, "another key": "other", "batches lose": "model"}[other]
    with Batcher(grace_seconds=1.0, clock=clock) as batcher:
        if other == "batches lose":
            for rows in range(1, 4):
                batcher.policy.record((CostedTable, "model"), rows, rows * 1.0 if rows == 1 else rows * 2.0)
            assert batcher.policy.plan((CostedTable, "model"), 2) == [1, 1]
            assert not batcher.policy.gathers((CostedTable, "model"))
        busy = batcher.member(costed(table, clock, BatchLog(), key=key))
        stepping = [batcher.member(costed(table, clock, log)) for _ in range(2)]
        release, errors = threading.Event(), []
        with busy.active():
            busy.position  # it has called: a batch it could join would wait for its step
            threads = [stepper(m, i + 1, steps, errors) for i, m in enumerate(stepping)]
            for thread in threads:
                thread.start()
            done = finished(threads)
            release.set()
    assert done and not errors, errors
    if other == "batches lose":
        assert log.sizes == []  # every step alone, as planned


@pytest.mark.parametrize("stall", [0.0, 0.02], ids=["no stall", "a stall of 20 ms"])
def test_prompt_chunks_and_decode_batches_interleave_within_the_stated_bounds(table, rng, stall):
    """Two members decode while three long prompts come in. Decode latency: between two decode batches run only the
    prompt chunks the stall allows: a decode step waiting lets chunks start while it has waited less than the stall
    (none: one chunk after each batch), and its steps come back within one chunk of a batch, so a run of chunks
    holds at most stall / chunk + 2 of them. Time to first token: while prompts wait, every decode batch is followed
    by a chunk; with a stall, chunks run together; the prompts take their chunks in turn (between two chunks of one
    prompt, at most one chunk of each other)."""
    clock, log = ScriptedClock(), BatchLog()
    with Batcher(grace_seconds=1.0, policy=AlwaysBatch(), clock=clock, decode_stall_seconds=stall) as batcher:
        decoders = [batcher.member(costed(table, clock, log)) for _ in range(2)]
        prompted = [batcher.member(costed(table, clock, log)) for _ in range(3)]
        errors, started = [], threading.Barrier(5)

        def prompt(member, ids):
            def run():
                try:
                    with member.active():
                        member.position
                        started.wait(WATCHDOG)
                        member.feed(ids, GREEDY, 0.0, ids)
                except BaseException as error:  # noqa: BLE001
                    errors.append(error)
            return threading.Thread(target=run, daemon=True)

        prompts = [random_ids(rng, VOCAB, 8 * 5 + 3) for _ in prompted]  # 5 chunks of 8 (no prompt path) and 3
        threads = [stepper(m, i + 1, 60, errors, before=lambda m=m: (m.position, started.wait(WATCHDOG)))
                   for i, m in enumerate(decoders)]
        threads += [prompt(m, ids) for m, ids in zip(prompted, prompts)]
        for thread in threads:
            thread.start()
        assert finished(threads) and not errors, errors
    # the batcher's jobs in order: "D" a decode batch (a step_batch, whose rows' feeds follow it, or a lone feed
    # of a decoder), "p0".."p2" a chunk of that prompt
    names = {id(m.engine): f"p{i}" for i, m in enumerate(prompted)}
    jobs: list[str] = []
    rows_left = 0
    for engine, call, n in log.calls:
        if call == "step_batch":
            jobs.append("D")
            rows_left = n
        elif rows_left:
            rows_left -= 1
        else:
            jobs.append(names[id(engine)] if n > 1 else "D")
    chunk_runs = [len(run) for run in "".join("x" if j != "D" else " " for j in jobs).split()]
    if stall:
        assert 1 < max(chunk_runs) <= stall // VRAM.prompt(8) + 2, (chunk_runs, jobs)
    else:
        assert max(chunk_runs) == 1, jobs      # never two chunks without a decode batch between them
    firsts = {p: jobs.index(p) for p in ("p0", "p1", "p2")}
    lasts = {p: len(jobs) - 1 - jobs[::-1].index(p) for p in ("p0", "p1", "p2")}
    while_prompting = jobs[min(firsts.values()):max(lasts.values()) + 1]
    assert "DD" not in "".join("D" if j == "D" else "x" for j in while_prompting), jobs  # a chunk after each batch
    for p in ("p0", "p1", "p2"):
        mine = [i for i, j in enumerate(jobs) if j == p]
        assert len(mine) == 6
        for before, after in zip(mine, mine[1:]):
            others = [j for j in jobs[before + 1:after] if j != "D"]
            assert len(others) == len(set(others)) <= 2, (p, jobs)  # each other prompt at most once between


def run_sessions(batcher: Batcher, make_member, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy completions of `prompts`, each on a session over `make_member()`, all at once."""
    sessions = [Session(make_member(), CharCodec()) for _ in prompts]
    gate = threading.Barrier(len(prompts))

    def work(i: int) -> list[int]:
        with sessions[i].engine.active():
            sessions[i].engine.position
            gate.wait(WATCHDOG)
            return list(sessions[i].complete(prompts[i], max_tokens=max_tokens).tokens)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(work, range(len(prompts))))


@pytest.mark.parametrize("model", ["vram", "losing"])
def test_the_measuring_batcher_is_never_slower_than_taking_turns(table, rng, model):
    """Eight sessions of 40 tokens each through the batcher and its own measuring policy, on the scripted clock:
    the engine time they took against their steps alone one after another (taking turns: every token a lone step,
    every prompt the same pieces). Where batches win (every expert in VRAM) they take well under half of it; where
    they lose, no more than taking turns and the policy's probes."""
    costs = {"vram": VRAM, "losing": LOSING}[model]
    sessions, tokens = 8, 40
    prompts = [random_ids(rng, VOCAB, 3) for _ in range(sessions)]
    clock, log = ScriptedClock(), BatchLog()
    with Batcher(grace_seconds=1.0, clock=clock) as batcher:
        together = run_sessions(batcher, lambda: batcher.member(costed(table, clock, log, costs)), prompts, tokens)
        spent = clock.now
    turns_clock = ScriptedClock()
    alone = [list(Session(costed(table, turns_clock, BatchLog(), costs), CharCodec()).complete(
        p, max_tokens=tokens).tokens) for p in prompts]
    assert together == alone
    turns = turns_clock.now
    if model == "vram":
        assert spent < 0.5 * turns and max(log.sizes) == sessions, log.sizes
    else:
        # the probes: at most one batch of each size 2..8 (this run is far shorter than REPROBE_AFTER plans), each
        # costing at most its excess over its rows alone; every other step ran alone
        assert len(log.sizes) == len(set(log.sizes)) <= sessions - 1 and tokens * sessions < REPROBE_AFTER * 2
        excess = sum(costs.batch(n) - n * costs.lone for n in log.sizes)
        assert spent <= turns + excess + 1e-9, (spent, turns, excess)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    with inspect(tiny_model("qwen3next", seed=7)) as file:
        return file.tokenizer()


def test_the_whole_mix_on_a_scripted_engine_answers_as_alone(tokenizer, rng):
    """The mixed jobs (joins, leaves, cancels, stops, prompts of every length, greedy and sampled) and the whole
    mix's (structured output, drafts, logprobs) on the table engine over the tiny model's tokenizer, through the
    measuring policy on the scripted clock, answer each as alone."""
    vocab = len(tokenizer.tokens)
    logits = rng.normal(0, 3, (vocab, vocab)).astype(np.float32)
    logits[:, tokenizer.eos_ids] -= 4.0  # EOS now and then, where a grammar does not force it
    clock, log = ScriptedClock(), BatchLog()

    def make(batched: bool) -> CostedTable:
        return CostedTable(logits, context=CONTEXT, log=log if batched else BatchLog(), clock=clock, costs=VRAM)

    class Greedy:
        """The table's greedy continuation, its second draft wrong at some lengths."""

        def propose(self, history, k):
            drafts = [int(history[-1])]
            for _ in range(k):
                drafts.append(int(np.argmax(logits[drafts[-1]])))
            return [1 + t % 200 if len(history) % 3 == 0 and i == 1 else t for i, t in enumerate(drafts[1:])]

    with Batcher(grace_seconds=1.0, clock=clock) as batcher:
        sessions = check_mix(make, tokenizer, rng, 200, batcher, whole=True, drafter=Greedy)
    assert log.calls_one_at_a_time_on(batcher.thread_id) and max(log.sizes) > 1
    assert sum(s.stats.accepted for s in sessions) > 0


def test_before_compute_runs_right_before_each_engine_call_of_its_member(table, rng):
    """A member's before_compute (where the server hands a stream's events to its event loop) runs before every
    engine call that serves it, its prompt's chunks, its lone and batched steps alike, once each, on the thread
    that makes the call (the batcher's; a lone step's, its member's own); a member without one is served as
    before."""
    clock, log = ScriptedClock(), BatchLog()
    with Batcher(grace_seconds=1.0, policy=AlwaysBatch(), clock=clock) as batcher:
        members = [batcher.member(costed(table, clock, log)) for _ in range(3)]
        threads: set[int] = set()
        for i, member in enumerate(members[:2]):
            def hook(i=i):
                threads.add(threading.get_ident())
                log.calls.append((f"hook {i}", "hook", 0))
            member.before_compute = hook
        made = iter(members)
        run_sessions(batcher, lambda: next(made), [random_ids(rng, VOCAB, n) for n in (20, 3, 9)], 12)
    assert batcher.thread_id in threads and log.calls_one_at_a_time_on(batcher.thread_id)
    for i, member in enumerate(members[:2]):
        mine = ["hook" if who == f"hook {i}" else call for who, call, _ in log.calls
                if who == f"hook {i}" or who is member.engine]
        # every engine call right after a hook of its own (a hook may also precede a call that reads an attribute,
        # which the log does not show)
        assert all(mine[j - 1] == "hook" for j, call in enumerate(mine) if call != "hook"), mine
        assert mine.count("prefill") == (2 if i == 0 else 0) and mine.count("feed") == 12, mine
    assert not any(who == "hook 2" for who, _, _ in log.calls)
