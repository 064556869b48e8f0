"""`strata serve` against the official openai client on 127.0.0.1: the reference engine on a tiny model (its
answers equal a Session's), scripted engines for what must be known in advance (tool calls, stops, which client
gets which answer) or must take time (cancellation, a full queue, load)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


import openai
import pytest

from support.server_harness import ScriptedEngine, client, echo_session, get, turn_start, wait_idle
from strata.api import load
from strata.generation import Session
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize

CONTEXT = 256
USER = [{"role": "user", "content": "hello there"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def model(tiny_model):
    with load(tiny_model("qwen3next", seed=4), engine="reference") as model:
        yield model


@pytest.fixture(scope="module")
def tok(model):
    return model.tokenizer




# ------------------------------------------------------------------------------------- reference engine


def test_chat_and_completions_answer_as_a_session_does(model, tok):
    direct = model.session(CONTEXT)
    expected_chat = direct.chat_complete(USER, 12)
    expected_text = model.session(CONTEXT).complete("Once upon", 10)
    server = Server([model.session(CONTEXT), model.session(CONTEXT)], "tiny")
    with serving(server) as url, client(url) as api:
        chat = api.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0)
        assert chat.choices[0].message.content == expected_chat.text
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage.prompt_tokens == expected_chat.usage.prompt_tokens
        assert chat.usage.completion_tokens == 12 and chat.model == "tiny"

        chunks = list(api.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0,
                                                  stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_chat.text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
        # the same conversation again: the session that holds it answers from its snapshot
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == expected_chat.usage.prompt_tokens - 1

        text = api.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0)
        assert text.choices[0].text == expected_text.text and text.object == "text_completion"
        streamed = api.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0,
                                          stream=True)
        assert "".join(c.choices[0].text for c in streamed) == expected_text.text

        ids = api.completions.create(model="tiny", prompt=tok.encode("Once upon"), max_tokens=10, temperature=0)
        assert ids.choices[0].text == expected_text.text
        assert [m.id for m in api.models.list().data] == ["tiny"]


def test_a_continued_conversation_reuses_its_prefix(model):
    server = Server([model.session(CONTEXT)], "tiny")
    with serving(server) as url, client(url) as api:
        first = api.chat.completions.create(model="tiny", messages=USER, max_tokens=6, temperature=0)
        again = [*USER, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and then?"}]
        second = api.chat.completions.create(model="tiny", messages=again, max_tokens=6, temperature=0)
        assert second.usage.prompt_tokens > first.usage.prompt_tokens
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_a_drafting_session_answers_as_a_plain_one_and_the_metrics_count_its_drafts(model):
    messages = [{"role": "user", "content": "one two three one two three one two three one two"}]
    plain = model.session(CONTEXT).chat_complete(messages, 16)
    session = model.session(CONTEXT, draft="lookup", draft_tokens=3)
    server = Server([session], "tiny")
    with serving(server) as url, client(url) as api:
        answer = api.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
        assert answer.choices[0].message.content == plain.text
        metrics = get(url, "/metrics")
    assert f"strata_drafted_tokens_total {session.stats.drafted}\n" in metrics
    assert f"strata_accepted_tokens_total {session.stats.accepted}\n" in metrics


def test_interleaved_conversations_each_resume_on_their_own_session(model):
    """Two conversations sharing a system prompt, one request at a time on two sessions: each turn after a
    conversation's first resumes from what its session holds; neither evicts the other."""
    system = {"role": "system", "content": "You are terse."}
    conversations = {"a": [system], "b": [system]}
    server = Server([model.session(CONTEXT), model.session(CONTEXT)], "tiny")
    cached: dict[str, list[int]] = {"a": [], "b": []}
    with serving(server) as url, client(url) as api:
        for turn in range(3):
            for name, messages in conversations.items():
                messages.append({"role": "user", "content": f"{name} turn {turn}"})
                answer = api.chat.completions.create(model="tiny", messages=messages, max_tokens=3, temperature=0)
                messages.append({"role": "assistant", "content": answer.choices[0].message.content})
                cached[name].append(answer.usage.prompt_tokens_details.cached_tokens)
    for name, counts in cached.items():
        assert counts[0] == 0 and all(c > 0 for c in counts[1:]), (name, counts)
    assert all(session.tokens for session in server.pool.sessions)


def test_sampling_seed_logprobs_and_usage(model, tok):
    server = Server([model.session(CONTEXT)], "tiny")
    with serving(server) as url, client(url) as api:
        def sampled(seed):
            answer = api.chat.completions.create(model="tiny", messages=USER, max_tokens=10, temperature=1.0,
                                                 top_p=0.9, seed=seed, extra_body={"top_k": 40})
            return answer.choices[0].message.content
        assert sampled(7) == sampled(7)
        assert len({sampled(s) for s in range(6)}) > 1

        chat = api.chat.completions.create(model="tiny", messages=USER, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=3)
        content = chat.choices[0].logprobs.content
        assert len(content) == 5
        for entry in content:
            assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
            # greedy: the chosen token is the most likely one
            assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)
        text = api.completions.create(model="tiny", prompt="Once upon", max_tokens=4, temperature=0, logprobs=2)
        assert len(text.choices[0].logprobs.tokens) == 4
        assert all(len(top) <= 2 for top in text.choices[0].logprobs.top_logprobs)


# ------------------------------------------------------------------------------------- scripted engines


def test_stop_strings_end_the_answer_before_them(tok):
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url, client(url) as api:
        words = [{"role": "user", "content": "alpha beta gamma delta"}]
        whole = api.chat.completions.create(model="echo", messages=words, stop=[" gamma", "zzz"])
        assert whole.choices[0].message.content == "alpha beta"
        assert whole.choices[0].finish_reason == "stop"
        parts = api.chat.completions.create(model="echo", messages=words, stop=" delta", stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in parts) == "alpha beta gamma"
        assert api.chat.completions.create(model="echo", messages=words).choices[0].message.content == \
            "alpha beta gamma delta"


def test_a_tool_call_round_trip(tok):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    def answer(seen):
        return tok.encode("It is sunny in Paris." if "<tool_response>" in tok.decode(seen) else call)

    engine = ScriptedEngine(answer, turn_start(tok), tok.eos_ids[0], context=CONTEXT * 4)
    server = Server([Session(engine, tok)], "tools")
    with serving(server) as url, client(url) as api:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = api.chat.completions.create(model="tools", messages=messages, tools=[WEATHER])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        (called,) = choice.message.tool_calls
        assert called.function.name == "get_weather" and json.loads(called.function.arguments) == {"city": "Paris"}
        assert "get_weather" in tok.decode(engine.fed) and "<tools>" in tok.decode(engine.fed)

        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": called.id, "content": "sunny, 21 C"}]
        chunks = list(api.chat.completions.create(model="tools", messages=messages, tools=[WEATHER], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "It is sunny in Paris."
        assert chunks[-1].choices[0].finish_reason == "stop"
        fed = tok.decode(engine.fed)
        assert "<tool_response>\nsunny, 21 C\n</tool_response>" in fed
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in fed

        # streamed, the call arrives whole in one delta and none of its text leaks into the content
        streamed = list(api.chat.completions.create(model="tools", messages=messages[:1], tools=[WEATHER],
                                                    stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == ""
        calls = [t for c in streamed for t in (c.choices[0].delta.tool_calls or [])]
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_a_client_that_hangs_up_cancels_at_a_token_boundary(tok):
    long_text = " ".join(f"w{i}" for i in range(100))
    session = echo_session(tok, 4 * CONTEXT, delay=0.01)
    server = Server([session], "echo")
    with serving(server) as url, client(url) as api:
        stream = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": long_text}],
                                             stream=True)
        got = ""
        for chunk in stream:
            got += chunk.choices[0].delta.content or ""
            if len(got) > 10:
                break
        stream.close()
        time.sleep(0.05)
        wait_idle(server)
        assert session.stats.finish_reason == "cancelled"
        assert 0 < session.stats.generated_tokens < len(tok.encode(long_text))
        made = session.stats.generated_tokens
        assert session.tokens[-made:] == tok.encode(long_text)[:made]  # what was generated, nothing else

        # a whole answer whose client gives up waiting
        with client(url, timeout=0.3) as impatient, pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="echo",
                                              messages=[{"role": "user", "content": long_text + " again"}])
        wait_idle(server)
        assert session.stats.finish_reason == "cancelled"
        assert session.stats.generated_tokens < len(tok.encode(long_text))

        after = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "still here"}])
        assert after.choices[0].message.content == "still here"
        metrics = get(url, "/metrics")
        assert 'strata_requests_total{endpoint="/v1/chat/completions",status="499"} 2' in metrics


def test_a_full_queue_is_refused_at_once_with_429(tok):
    server = Server([echo_session(tok, CONTEXT, delay=0.05)], "echo", max_waiting=1)
    slow = [{"role": "user", "content": " ".join(["word"] * 8)}]
    with serving(server) as url, client(url) as api:
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(api.chat.completions.create, model="echo", messages=slow) for _ in range(2)]
            deadline = time.monotonic() + 5
            while not (server.pool.busy == 1 and server.pool.waiting == 1):
                assert time.monotonic() < deadline
                time.sleep(0.005)
            with pytest.raises(openai.RateLimitError) as refused:
                api.chat.completions.create(model="echo", messages=slow)
            # refused while the first still generates and the second still waits: it did not queue
            assert server.pool.busy == 1 and server.pool.waiting == 1 and not any(f.done() for f in running)
            assert refused.value.response.headers["retry-after"] == "1"
            assert refused.value.body["code"] == "rate_limit_exceeded"
            assert [f.result().choices[0].message.content for f in running] == [slow[0]["content"]] * 2


def test_load_every_request_answered_or_refused_and_none_mixed(tok):
    """32 clients x 4 requests on 2 sessions with 8 places in the queue."""
    server = Server([echo_session(tok, CONTEXT, delay=0.001) for _ in range(2)], "echo", max_waiting=8)
    outcomes: dict[tuple[int, int], str] = {}
    lock = threading.Lock()

    def client_run(c: int, api: openai.OpenAI) -> None:
        for r in range(4):
            text = f"client {c} request {r}"
            messages = [{"role": "user", "content": text}]
            try:
                if (c + r) % 2:
                    chunks = api.chat.completions.create(model="echo", messages=messages, stream=True)
                    got = "".join(ch.choices[0].delta.content or "" for ch in chunks)
                else:
                    got = api.chat.completions.create(model="echo", messages=messages).choices[0].message.content
                outcome = "ok" if got == text else f"mixed: {got!r}"
            except openai.RateLimitError:
                outcome = "429"
            with lock:
                outcomes[(c, r)] = outcome

    with serving(server) as url, client(url) as api:
        with ThreadPoolExecutor(32) as pool:
            for future in [pool.submit(client_run, c, api) for c in range(32)]:
                future.result()
        assert len(outcomes) == 128
        assert set(outcomes.values()) <= {"ok", "429"}, sorted(set(outcomes.values()))
        answered = list(outcomes.values()).count("ok")
        assert answered >= 10  # the first ten always fit: two generating, eight waiting
        wait_idle(server)
        health = json.loads(get(url, "/health"))
        assert health == {"status": "ok", "sessions": 2, "busy": 0, "waiting": 0}
        metrics = get(url, "/metrics")
        assert f'endpoint="/v1/chat/completions",status="200"}} {answered}' in metrics
        assert "strata_queue_depth 0" in metrics
        assert api.chat.completions.create(model="echo", messages=USER).choices[0].message.content == "hello there"


def test_strata_serve_answers_then_stops_cleanly_on_ctrl_c(tmp_path):
    path = tmp_path / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", seed=4)
    with socket.socket() as probe:  # a port free a moment ago; the server takes it right after
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "STRATA_API_KEY": "sesame"}
    server = subprocess.Popen([sys.executable, "-m", "strata.cli", "serve", str(path), "--engine", "reference",
                               "--port", str(port), "--context", "128", "--kv", "bf16"],
                              stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert json.loads(get(url, "/health"))["status"] == "ok"
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "strata serve did not start"
                time.sleep(0.1)
        with client(url, "sesame") as api:
            assert [m.id for m in api.models.list().data] == ["tiny"]
            # Greedy: a sampled answer may open with EOS on some draws (the request's seed is random otherwise).
            chat = api.chat.completions.create(model="tiny", messages=USER, max_tokens=4, temperature=0)
            assert chat.usage.completion_tokens == 4
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(30)
        with server.stderr:
            err = server.stderr.read()
    assert code == 0, err
    assert f"on http://127.0.0.1:{port}/v1 (reference engine, 1 session(s) of 128 tokens)" in err
    assert "--kv ignored" in err
