"""A request's several answers (n choices, a list of prompts) against a live server: each on its own session of the
pool as far as it spares them, stepping together in the Batcher, every answer what the sequential run (one
session, batch 1) gives with the same seeds; a pool smaller than the answers, or of one session, answers them all;
a waiting request is given a session at the end of an answer; a stream interleaves the answers, each in order; a
client that hangs up, or an answer that fails, hands every session back."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from strata.errors import StrataError
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.server import Server
from strata.server.background import serving
from support.batch_engine import BatchingReference, BatchLog
from support.server_harness import ScriptedEngine, client, echo_session, turn_start, user_text, wait_idle

CONTEXT = 256
PROMPTS = ["one two three", "tell me about the sea"]
SAMPLED = {"temperature": 1.0, "seed": 7, "max_tokens": 6}
CHAT = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def model_file(tiny_model):
    with inspect(tiny_model("qwen3next", seed=4)) as file:
        yield file


@pytest.fixture(scope="module")
def tok(model_file):
    return model_file.tokenizer()


def reference_sessions(model_file, count: int, log: BatchLog | None = None) -> list[Session]:
    return [Session(BatchingReference(Reference(model_file), CONTEXT, log=log or BatchLog()), model_file.tokenizer())
            for _ in range(count)]


def answers(api) -> dict:
    """What the client gets for a list of prompts with n choices each, and for a chat of n choices, streamed or
    not: each choice's index, text and finish reason, and the usage's counts."""
    whole = api.completions.create(model="tiny", prompt=PROMPTS, n=3, **SAMPLED)
    chat = api.chat.completions.create(model="tiny", messages=CHAT, n=4, **SAMPLED)
    stream = list(api.completions.create(model="tiny", prompt=PROMPTS[1], n=3, stream=True,
                                         stream_options={"include_usage": True}, **SAMPLED))
    return {"completions": [(c.index, c.text, c.finish_reason) for c in whole.choices],
            "chat": [(c.index, c.message.content, c.finish_reason) for c in chat.choices],
            "usage": [(u.prompt_tokens, u.completion_tokens) for u in (whole.usage, chat.usage, stream[-1].usage)],
            "streamed": streamed_choices(stream[:-1])}


def streamed_choices(chunks) -> list[tuple[int, str, str]]:
    """Each index's text and finish reason from a stream's chunks (completions' or chat's), checking that its
    finish comes last."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks:
        (choice,) = chunk.choices
        assert choice.index not in finishes, f"choice {choice.index} went on after its finish"
        text = (choice.delta.content or "") if hasattr(choice, "delta") else choice.text
        texts[choice.index] = texts.get(choice.index, "") + text
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    return [(i, texts[i], finishes[i]) for i in sorted(texts)]


def interleaved(indexes: list[int]) -> bool:
    """Whether some choice's chunk came after a later choice's had begun (the answers were not run in turn)."""
    return any(a > b for a, b in zip(indexes, indexes[1:]))


@pytest.fixture(scope="module")
def sequential(model_file) -> dict:
    """The answers as one session at batch 1 gives them: one after another."""
    server = Server(reference_sessions(model_file, 1), "tiny")
    with serving(server) as url, client(url) as api:
        got = answers(api)
    server.close()
    return got


@pytest.mark.parametrize("sessions, batch", [(3, 3), (1, 2), (2, 1)], ids=["3-sessions", "1-session", "batch-1"])
def test_several_answers_are_the_sequential_runs_and_step_together(model_file, sequential, sessions, batch):
    """Six answers of two prompts, four chat choices and a stream of three, on three batching sessions (fewer
    than the answers), on one session at batch 2 (nothing to spare) and on two at batch 1 (one at a time), are
    each the sequential run's with the same seeds; where there are sessions to spare, their steps ran together."""
    log = BatchLog()
    server = Server(reference_sessions(model_file, sessions, log), "tiny", batch=batch)
    with serving(server) as url, client(url) as api:
        got = answers(api)
        wait_idle(server)
    server.close()
    assert got == sequential
    assert [i for i, *_ in got["completions"]] == list(range(6))
    assert server.pool.busy == 0 and len(server.pool.free) == sessions
    if sessions > 1 and batch > 1:
        assert max(log.sizes) > 1  # the answers' decode steps ran as one batched step
        assert all(s.stats.generated_tokens for s in server.pool.sessions)  # every session answered
    else:
        assert not log.batches


def test_a_stream_interleaves_the_answers_each_in_its_order(model_file):
    log = BatchLog()
    server = Server(reference_sessions(model_file, 3, log), "tiny", batch=3)
    with serving(server) as url, client(url) as api:
        whole = api.completions.create(model="tiny", prompt=PROMPTS[0], n=3, **SAMPLED)
        chunks = list(api.completions.create(model="tiny", prompt=PROMPTS[0], n=3, stream=True, **SAMPLED))
        whole_chat = api.chat.completions.create(model="tiny", messages=CHAT, n=3, **SAMPLED)
        chat = list(api.chat.completions.create(model="tiny", messages=CHAT, n=3, stream=True, **SAMPLED))
        wait_idle(server)
    server.close()
    assert streamed_choices(chunks) == [(c.index, c.text, c.finish_reason) for c in whole.choices]
    assert interleaved([c.choices[0].index for c in chunks])
    # chat: every choice's role first, then its content in order, its finish last
    assert [c.choices[0].delta.role for c in chat[:3]] == ["assistant"] * 3
    assert streamed_choices(chat) == [(c.index, c.message.content, c.finish_reason) for c in whole_chat.choices]
    assert interleaved([c.choices[0].index for c in chat if c.choices[0].delta.content])


def test_a_waiting_request_gets_a_session_when_an_answer_ends(tok):
    """A request of four long answers holds both sessions; a request that comes meanwhile waits only for the end of
    one of its answers, not for all four, and the four still come back whole, one session running the rest."""
    text = " ".join(f"w{i}" for i in range(16))
    server = Server([echo_session(tok, CONTEXT, delay=0.003) for _ in range(2)], "echo", batch=2)
    done: dict[str, float] = {}

    def ask(api, name: str, n: int, content: str) -> list[str]:
        reply = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": content}], n=n)
        done[name] = time.monotonic()
        return [c.message.content for c in reply.choices]

    with serving(server) as url, client(url) as api, ThreadPoolExecutor(2) as pool:
        many = pool.submit(ask, api, "many", 4, text)
        deadline = time.monotonic() + 10
        while server.pool.busy < 2:
            assert time.monotonic() < deadline, "the request of four answers took no second session"
            time.sleep(0.005)
        one = pool.submit(ask, api, "one", 1, "and me")
        assert one.result(timeout=30) == ["and me"]
        assert many.result(timeout=30) == [text] * 4
        wait_idle(server)
    server.close()
    assert done["one"] < done["many"]


class FailingEcho(ScriptedEngine):
    """The echo session's engine, whose feeds fail (a fault of the model) once `fail_after` of them ran."""

    def __init__(self, *args, fail_after: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_after, self.feeds = fail_after, 0

    def feed(self, ids, params, u, seen):
        self.feeds += 1
        if self.fail_after is not None and self.feeds > self.fail_after:
            raise StrataError("the engine failed")
        return super().feed(ids, params, u, seen)


def test_an_answer_that_fails_fails_the_request_and_every_session_comes_back(tok):
    engines = [FailingEcho(lambda seen: tok.encode(user_text(tok, seen)), turn_start(tok), tok.eos_ids[0],
                           context=CONTEXT, delay=0.002) for _ in range(3)]
    server = Server([Session(e, tok) for e in engines], "echo", batch=3)
    long_chat = [{"role": "user", "content": " ".join(f"w{i}" for i in range(40))}]
    with serving(server) as url, client(url) as api:
        for stream in (False, True):
            for e in engines:
                e.feeds, e.fail_after = 0, None
            engines[1].fail_after = 5  # one session's answer fails after it began
            if stream:
                chunks = api.chat.completions.create(model="echo", messages=long_chat, n=3, stream=True)
                with pytest.raises(openai.APIError) as failed:
                    list(chunks)
                assert "the model failed: the engine failed" in str(failed.value)
            else:
                with pytest.raises(openai.InternalServerError) as failed:
                    api.chat.completions.create(model="echo", messages=long_chat, n=3)
                assert failed.value.status_code == 500 and failed.value.body["code"] == "model_error"
            wait_idle(server)
            assert len(server.pool.free) == 3
            assert all(e.feeds for e in engines)  # the three answers ran at once
        engines[1].fail_after = None
        again = api.chat.completions.create(model="echo", messages=CHAT, n=3)
        assert [c.message.content for c in again.choices] == ["hello there"] * 3
    server.close()


def test_a_client_that_hangs_up_stops_every_answer_and_hands_each_session_back(tok):
    text = " ".join(f"w{i}" for i in range(80))
    sessions = [echo_session(tok, 4 * CONTEXT, delay=0.003) for _ in range(3)]
    server = Server(sessions, "echo", batch=3)
    with serving(server) as url, client(url) as api:
        stream = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": text}], n=3,
                                             stream=True)
        seen = set()
        for chunk in stream:
            seen.add(chunk.choices[0].index)
            if len(seen) == 3 and chunk.choices[0].delta.content:
                break
        stream.close()
        wait_idle(server, 20.0)
        assert len(server.pool.free) == 3
        for session in sessions:  # each stopped partway, holding its prompt and exactly what it generated
            stats = session.stats
            assert stats.finish_reason == "cancelled" and 0 < stats.generated_tokens < len(tok.encode(text))
            assert len(session.tokens) == stats.prompt_tokens + stats.generated_tokens
        # every session serves again
        again = api.chat.completions.create(model="echo", messages=CHAT, n=3)
        assert [c.message.content for c in again.choices] == ["hello there"] * 3
    server.close()


def test_requests_of_several_answers_on_one_session_all_answer(tok):
    """More answers than sessions, from several requests at once, on a pool of one: no request waits for a
    session while holding one, so all of them answer."""
    server = Server([echo_session(tok, CONTEXT)], "echo", batch=2)
    start = threading.Barrier(3)

    def ask(api, word: str) -> list[str]:
        start.wait(timeout=30)
        reply = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": word}], n=3)
        return [c.message.content for c in reply.choices]

    with serving(server) as url, client(url) as api, ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda word: ask(api, word), ["red", "green", "blue"]))
        wait_idle(server)
    server.close()
    assert got == [[word] * 3 for word in ["red", "green", "blue"]]
