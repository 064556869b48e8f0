"""The server with sessions stepping together (`batch`): concurrent streams answer as each alone, a cancelled one
frees its session while the others go on, /metrics counts the batches, batch 1 keeps one compute thread, and
`strata serve` makes the sessions that fit."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from strata.errors import OutOfMemory
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.server import Server
from strata.server.background import serving
from strata.generation.draft_length import FixedDraftLength
from strata.generation.drafts import LookupDrafter
from support.batch_engine import BatchingReference, BatchLog
from support.server_harness import ScriptedEngine, client, echo_session, get, turn_start, wait_idle

CONTEXT = 256
QUESTIONS = ["hello there", "what is the time", "one two three four", "tell me a story about the sea"]


@pytest.fixture(scope="module")
def model_file(tiny_model):
    with inspect(tiny_model("qwen3next", seed=4)) as file:
        yield file


def batching_session(model_file, log: BatchLog) -> Session:
    return Session(BatchingReference(Reference(model_file), CONTEXT, log=log), model_file.tokenizer())


def metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])




SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}
# A mix of requests: chat and completions, greedy and sampled, streamed and whole, a JSON schema, logprobs, a stop,
# n choices, different lengths; more requests than sessions, so some wait and join as others leave
MIX = [("chat", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "temperature": 0,
                 "stream": True}),
       ("completion", {"prompt": "one two three", "max_tokens": 10, "temperature": 0.9, "seed": 5, "stream": True}),
       ("chat", {"messages": [{"role": "user", "content": "a number"}], "max_tokens": 40, "temperature": 0.7,
                 "seed": 3, "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}}),
       ("completion", {"prompt": "tell me", "max_tokens": 8, "logprobs": 2, "temperature": 0, "stream": True}),
       ("chat", {"messages": [{"role": "user", "content": "the sea"}], "max_tokens": 16, "stop": ["e"],
                 "temperature": 0}),
       ("completion", {"prompt": "four five", "max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 11}),
       ("completion", {"prompt": "long long", "max_tokens": 20, "temperature": 0, "stream": True})]


def answer(api, kind: str, body: dict) -> list:
    """What a client gets: each choice's text (and logprobs), whole or streamed."""
    body = {"model": "tiny", **body}
    if kind == "chat":
        got = api.chat.completions.create(**body)
        if body.get("stream"):
            return ["".join(c.choices[0].delta.content or "" for c in got)]
        return [c.message.content for c in got.choices]
    got = api.completions.create(**body)
    if body.get("stream"):
        chunks = list(got)
        text = "".join(c.choices[0].text for c in chunks)
        logprobs = [c.choices[0].logprobs.top_logprobs for c in chunks if c.choices[0].logprobs]
        return [text, logprobs]
    return [(c.index, c.text) for c in got.choices]


@pytest.mark.parametrize("drafts", [False, True], ids=["plain", "drafted"])
def test_a_mix_of_requests_answers_each_as_alone_with_drafts_on_and_off(model_file, drafts):
    """The mix against a server of three batching sessions (drafting by prompt lookup, or not), all at once with
    a stream cancelled among them, answers each request as a server of one session at batch 1 answers it alone."""
    pytest.importorskip("llguidance")

    def sessions(count: int) -> list[Session]:
        made = []
        for _ in range(count):
            engine = BatchingReference(Reference(model_file), CONTEXT, log=BatchLog())
            made.append(Session(engine, model_file.tokenizer(), LookupDrafter(), 3, draft_length=FixedDraftLength(3))
                        if drafts else Session(engine, model_file.tokenizer()))
        return made

    alone_server = Server(sessions(1), "tiny")
    with serving(alone_server) as url, client(url) as api:
        alone = [answer(api, kind, body) for kind, body in MIX]
    alone_server.close()
    server = Server(sessions(3), "tiny", batch=3)
    start = threading.Barrier(len(MIX) + 1)

    def ask(api, kind, body):
        start.wait(timeout=30)
        return answer(api, kind, body)

    def cancelled(api):
        start.wait(timeout=30)
        stream = api.completions.create(model="tiny", prompt="cut short", max_tokens=40, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()

    with serving(server) as url, client(url) as api, ThreadPoolExecutor(len(MIX) + 1) as pool:
        quitter = pool.submit(cancelled, api)
        together = list(pool.map(lambda job: ask(api, *job), MIX))
        quitter.result(timeout=60)
        wait_idle(server, 20.0)
        metrics = get(url, "/metrics")
        stats = server.batcher.stats()
    server.close()
    for i, (a, b) in enumerate(zip(alone, together)):
        assert b == a, f"request {i}: {b} with the others, {a} alone"
    json.loads(together[2][0])  # the schema held
    assert (metric(metrics, "strata_drafted_tokens_total") > 0) == drafts
    assert stats["decode_rows"] > stats["decode_batches"]  # some steps ran together
    requests = sum(metric(metrics, f'strata_requests_total{{endpoint="/v1/{route}",status="{status}"}}')
                   for route in ("chat/completions", "completions") for status in (200, 499)
                   if f'endpoint="/v1/{route}",status="{status}"' in metrics)
    assert requests == len(MIX) + 1
    assert metric(metrics, "strata_queue_depth_on_arrival_count") == len(MIX) + 1
    assert metric(metrics, "strata_time_to_first_token_seconds_count") == len(MIX) + 1
    assert metric(metrics, "strata_decode_batch_rows_count") == stats["decode_batches"]
    assert metric(metrics, "strata_decode_batch_rows_sum") == stats["decode_rows"]


def test_concurrent_streams_answer_as_each_alone_and_the_metrics_count_batches(model_file):
    alone = [batching_session(model_file, BatchLog()).chat_complete([{"role": "user", "content": q}], 10).text
             for q in QUESTIONS]
    log = BatchLog()
    server = Server([batching_session(model_file, log) for _ in QUESTIONS], "tiny", batch=len(QUESTIONS))
    log.threads.clear()  # the sessions were made here; from now on their engines are the batcher's
    start = threading.Barrier(len(QUESTIONS))

    def ask(api, question: str) -> str:
        start.wait(timeout=30)
        chunks = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}],
                                             max_tokens=10, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks)

    with serving(server) as url, client(url) as api, ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(lambda q: ask(api, q), QUESTIONS))
        wait_idle(server, 20.0)
        metrics = get(url, "/metrics")
    server.close()
    assert answers == alone
    assert log.calls_one_at_a_time_on(server.batcher.thread_id)
    batches, rows = metric(metrics, "strata_decode_batches_total"), metric(metrics, "strata_decode_rows_total")
    assert rows == server.batcher.stats()["decode_rows"] and batches == server.batcher.stats()["decode_batches"]
    assert 0 < batches <= rows and metric(metrics, "strata_batch_limit") == len(QUESTIONS)
    assert metric(metrics, "strata_prompt_chunks_total") > 0
    # the sessions' engines are theirs again
    assert all(isinstance(s.engine, BatchingReference) for s in server.pool.sessions)


def test_a_cancelled_stream_frees_its_session_while_the_other_goes_on(tok):
    long_text = " ".join(f"w{i}" for i in range(60))
    sessions = [echo_session(tok, 4 * CONTEXT, delay=0.005) for _ in range(2)]
    server = Server(sessions, "echo", batch=2, decode_stall_seconds=0.01)  # prompt chunks may hold a step back
    assert server.batcher.decode_stall_seconds == 0.01
    with serving(server) as url, client(url) as api, client(url) as other:
        quitter = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": long_text}],
                                              stream=True)
        with ThreadPoolExecutor(1) as pool:
            whole = pool.submit(lambda: other.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": long_text + " and on"}]))
            got = ""
            for chunk in quitter:
                got += chunk.choices[0].delta.content or ""
                if len(got) > 10:
                    break
            quitter.close()
            assert whole.result(timeout=60).choices[0].message.content == long_text + " and on"
        wait_idle(server, 20.0)
        cancelled = [s for s in sessions if s.stats.finish_reason == "cancelled"]
        assert len(cancelled) == 1 and 0 < cancelled[0].stats.generated_tokens < len(tok.encode(long_text))
        # the freed session serves the next request
        again = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "again"}])
        assert again.choices[0].message.content == "again"
    server.close()


@pytest.fixture(scope="module")
def tok(model_file):
    return model_file.tokenizer()


class ThreadRecorder(ScriptedEngine):
    """The server harness's scripted engine, recording the threads its feeds ran on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()

    def feed(self, ids, params, u, seen):
        self.threads.add(threading.current_thread().name)
        return super().feed(ids, params, u, seen)


@pytest.mark.parametrize("batch, threads", [(1, {"strata-generate"}), (2, {"strata-batcher", "strata-run"})])
def test_batch_1_keeps_the_one_compute_thread_and_a_larger_one_the_batchers(tok, batch, threads):
    """At batch 1 every engine call runs on the one compute thread; above, on the batcher's, but a lone decode step
    (its session the only one generating) on its generation's own thread, which saves two handoffs a token."""
    engines = [ThreadRecorder(lambda seen: tok.encode("fine thanks"), turn_start(tok), tok.eos_ids[0],
                              context=CONTEXT) for _ in range(2)]
    server = Server([Session(e, tok) for e in engines], "echo", batch=batch)
    assert (server.batcher is None) == (batch == 1)
    assert all((s.engine is e) == (batch == 1) for s, e in zip(server.pool.sessions, engines))
    with serving(server) as url, client(url) as api, ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: api.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "how are you"}]).choices[0].message.content, range(4)))
        metrics = get(url, "/metrics")
    server.close()
    assert answers == ["fine thanks"] * 4
    assert {name.rsplit("_", 1)[0] for e in engines for name in e.threads} <= threads
    assert ("strata_decode_batches_total" in metrics) == (batch > 1)


def test_a_batch_of_sessions_that_do_not_all_fit_is_reduced(capsys, monkeypatch):
    from strata.cli import serve

    made = []

    def new_session(model, args):
        if len(made) == 3:
            raise OutOfMemory("VRAM: the session needs 2.0 GiB, 1.5 GiB free")
        made.append(object())
        return made[-1]

    monkeypatch.setattr(serve.session_options, "new_session", new_session)
    sessions: list = []
    serve.made_sessions(None, argparse.Namespace(), 8, sessions, reduce=True)
    assert sessions == made and len(sessions) == 3
    assert "3 of 8 sessions fit" in capsys.readouterr().err
    made.clear()
    with pytest.raises(OutOfMemory):
        serve.made_sessions(None, argparse.Namespace(), 8, [], reduce=False)
    made.clear()
    made.extend([object()] * 3)  # the first session itself does not fit: that is an error, batch or not
    with pytest.raises(OutOfMemory):
        serve.made_sessions(None, argparse.Namespace(), 8, [], reduce=True)


def test_strata_serve_batch_makes_its_sessions_and_refuses_a_batch_below_1(tiny_model, capsys):
    from strata.cli import main

    path = tiny_model("qwen3next", seed=4)
    assert main(["serve", str(path), "--engine", "reference", "--port", "0", "--batch", "0"]) == 1
    assert capsys.readouterr().err == "strata serve: --batch must be >= 1, got 0\n"
    for stall in ("-1", "nan", "inf"):
        assert main(["serve", str(path), "--engine", "reference", "--port", "0", "--batch", "2",
                     "--decode-stall", stall]) == 1
        assert "--decode-stall must be a number of milliseconds >= 0" in capsys.readouterr().err
    with socket.socket() as probe:  # a port free a moment ago; the server takes it right after
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "strata.cli", "serve", str(path), "--engine", "reference",
                               "--port", str(port), "--context", "128", "--batch", "3"],
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = json.loads(get(url, "/health"))
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "strata serve did not start"
                time.sleep(0.1)
        assert health["sessions"] == 3  # --batch above --sessions (1) makes that many
        assert metric(get(url, "/metrics"), "strata_batch_limit") == 3
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(30)
        with server.stderr:
            err = server.stderr.read()
    assert code == 0, err
    assert "(reference engine, 3 session(s) of 128 tokens), batch 3" in err
