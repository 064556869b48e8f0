"""The server's edges against a live server on 127.0.0.1: bodies too large or prompts too long refused before
they cost anything, rendering off the event loop, the model's name checked, one id and time per answer, raw token
bytes in logprobs, faults of the model answered 5xx; and `strata serve`'s start: the port before the model, a
chat template given on the command line or a warning when there is none."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from support.server_harness import client, echo_session
from strata.cli import main
from strata.format import inspect
from strata.generation import Session
from strata.sampling import SamplingParams, sample
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize

CONTEXT = 256
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model("qwen3next", seed=6)


@pytest.fixture(scope="module")
def tok(tiny):
    with inspect(tiny) as file:
        yield file.tokenizer()


def post(url: str, path: str, body: bytes, timeout: float = 10) -> tuple[int, dict]:
    request = urllib.request.Request(url.removesuffix("/v1") + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def get(url: str, path: str, timeout: float = 10) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + path, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


class CountingCodec:
    """The tokenizer, counting the texts it is asked to encode."""

    def __init__(self, tok):
        self.tok, self.encoded = tok, 0

    def encode(self, text, special=False):
        self.encoded += 1
        return self.tok.encode(text, special)

    def __getattr__(self, name):
        return getattr(self.tok, name)


class FixedEngine:
    """Answers the two bytes 0xC8 0xC9 (token ids 200, 201: neither a whole character) by the parity of the
    sequence, with three alternatives of which none decodes alone; `fail_at`: feeds after which every feed
    samples NaN logits (a model fault)."""

    def __init__(self, context: int = CONTEXT, fail_at: int | None = None):
        self.context, self.fail_at, self.position, self.feeds = context, fail_at, 0, 0

    def feed(self, ids, params: SamplingParams, u: float, seen) -> int:
        self.feeds += 1
        if self.fail_at is not None and self.feeds > self.fail_at:
            return sample(np.full(16, np.nan, dtype=np.float32), params, u, seen)
        self.position += len(ids)
        return 200 + len(seen) % 2

    def logprobs(self, token: int, n: int):
        return -0.5, [(200, -0.5), (201, -1.0), (202, -2.0)][:n]

    def reset(self) -> None:
        self.position = 0


# ------------------------------------------------------------------------------------------ request limits


def test_a_body_over_the_limit_is_refused_unread(tok):
    server = Server([echo_session(tok, CONTEXT)], "echo", max_body_bytes=2000)
    with serving(server) as url:
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        status, answer = post(url, "/v1/chat/completions", big)
        assert status == 413 and answer["error"]["code"] == "request_too_large", answer
        assert post(url, "/v1/chat/completions", json.dumps({"messages": HELLO}).encode())[0] == 200


def test_a_text_longer_than_the_context_can_hold_is_refused_before_it_is_tokenized(tok):
    codec = CountingCodec(tok)
    server = Server([Session(echo_session(tok, CONTEXT).engine, codec)], "echo")
    longest = max(map(len, tok.tokens))
    with serving(server) as url:
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * longest
                                                                    * CONTEXT}]}),
                           ("/v1/completions", {"prompt": "y" * longest * CONTEXT})]:
            status, answer = post(url, path, json.dumps(body).encode())
            assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
            assert "characters" in answer["error"]["message"]
        assert codec.encoded == 0


def test_rendering_runs_off_the_event_loop(tok):
    """A render that takes a second does not hold up /health, nor another request's answer."""
    rendering = threading.Event()

    class SlowRender(Session):  # the server renders and encodes a chat through chat_ids
        def chat_ids(self, messages, template_options=None, **options):
            if messages[-1]["content"] == "slow":
                rendering.set()
                time.sleep(1.5)
            return super().chat_ids(messages, template_options, **options)

    echo = echo_session(tok, CONTEXT)
    server = Server([SlowRender(echo.engine, tok), echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url, client(url) as api:
        slow = threading.Thread(target=api.chat.completions.create, kwargs=dict(
            model="echo", messages=[{"role": "user", "content": "slow"}]))
        slow.start()
        assert rendering.wait(10)
        start = time.monotonic()
        assert get(url, "/health")[1]["status"] == "ok"
        fast = api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "fast"}])
        assert fast.choices[0].message.content == "fast"
        assert time.monotonic() - start < 1.0
        slow.join(10)


# ------------------------------------------------------------------------------------------- what it says


def test_any_model_id_is_answered_by_the_model_served_and_a_lookup_finds_only_it(tok):
    """As llama-server: a client configured with another model's name keeps working."""
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url, client(url) as api:
        assert api.models.retrieve("echo").id == "echo"
        with pytest.raises(openai.NotFoundError) as missing:
            api.models.retrieve("gpt-4o")
        assert missing.value.body["code"] == "model_not_found"
        answer = api.chat.completions.create(model="gpt-4o", messages=HELLO)
        assert answer.choices[0].message.content == "hello" and answer.model == "echo"
        assert post(url, "/v1/chat/completions", json.dumps({"messages": HELLO}).encode())[0] == 200  # none named
        status, answer = post(url, "/v1/chat/completions", json.dumps({"messages": HELLO, "model": 7}).encode())
        assert status == 400 and answer["error"]["param"] == "model"


def test_a_stream_has_one_id_and_one_time(tok, monkeypatch):
    import strata.server.answers as app

    class Ticking:  # every reading of the clock a second later
        now = 1_000_000

        @classmethod
        def time(cls):
            cls.now += 1
            return cls.now

    monkeypatch.setattr(app, "time", Ticking)
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url, client(url) as api:
        chunks = list(api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c d"}],
                                                  stream=True, stream_options={"include_usage": True}))
        assert len(chunks) > 4
        assert len({c.created for c in chunks}) == 1 and len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("extra", [
    {"store": False}, {"store": True}, {"store": None}, {"metadata": {}}, {"metadata": {"a": "b"}},
    {"logit_bias": {}}, {"logit_bias": None}, {"n": None}, {"n": 1}, {"stream": None}, {"service_tier": "auto"},
    {"user": "u1"}, {"prompt_cache_key": "k"}, {"modalities": ["text"]}, {"parallel_tool_calls": True},
    {"logprobs": None}, {"top_logprobs": None}, {"stop": None}, {"seed": None}, {"seed": -1},
    {"cache_prompt": True}, {"typical_p": 1.0}, {"mirostat": 0}, {"id_slot": -1}, {"timings_per_token": False},
    {"frequency_penalty": 0}, {"presence_penalty": 0.0}, {"repeat_penalty": 1.0, "repetition_penalty": 1},
])
def test_fields_whose_values_change_nothing_are_accepted(tok, extra):
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url:
        status, answer = post(url, "/v1/chat/completions", json.dumps({"messages": HELLO, **extra}).encode())
        assert status == 200 and answer["choices"][0]["message"]["content"] == "hello", answer


@pytest.mark.parametrize("extra, param", [
    ({"modalities": ["audio"]}, "modalities"), ({"store": 0}, "store"), ({"user": 5}, "user"),
    ({"metadata": []}, "metadata"), ({"typical_p": 0.9}, "typical_p"), ({"parallel_tool_calls": 1},
                                                                       "parallel_tool_calls"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repeat_penalty"),
    # the echo engine's sampler applies no bias nor penalty: refused by name, before anything runs
    ({"logit_bias": {"5": 10}}, "logit_bias"), ({"frequency_penalty": 0.5}, "frequency_penalty"),
])
def test_fields_that_would_change_something_are_refused_by_name(tok, extra, param):
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url:
        status, answer = post(url, "/v1/chat/completions", json.dumps({"messages": HELLO, **extra}).encode())
        assert status == 400 and answer["error"]["param"] == param, answer


def test_logprobs_carry_each_tokens_own_bytes(tok):
    """Tokens that are pieces of a character keep their bytes, and two of them never read alike."""
    server = Server([Session(FixedEngine(), tok)], "bytes")
    own = {t: list(tok.token_bytes(t)) for t in (200, 201, 202)}
    assert tok.decode([200]) == tok.decode([201])  # both U+FFFD as text
    with serving(server) as url, client(url) as api:
        chat = api.chat.completions.create(model="bytes", messages=HELLO, max_tokens=4, logprobs=True,
                                           top_logprobs=3)
        for entry in chat.choices[0].logprobs.content:
            assert entry.bytes in (own[200], own[201])
            assert entry.token == "bytes:" + "".join(f"\\x{b:02x}" for b in entry.bytes)
            assert [alt.bytes for alt in entry.top_logprobs] == [own[200], own[201], own[202]]
        text = api.completions.create(model="bytes", prompt=[1, 2], max_tokens=3, logprobs=3)
        assert all(len(top) == 3 for top in text.choices[0].logprobs.top_logprobs)


def test_a_fault_of_the_model_is_a_server_error_streamed_or_not(tok):
    engine = FixedEngine(fail_at=0)
    server = Server([Session(engine, tok)], "nan")
    with serving(server) as url, client(url) as api:
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as failed:
                api.chat.completions.create(model="nan", messages=HELLO, stream=stream)
            assert failed.value.status_code == 500 and failed.value.body["code"] == "model_error"
            assert "NaN" in failed.value.body["message"]
        engine.fail_at, engine.feeds = 3, 0  # after the answer began: its last event is the error
        request = urllib.request.Request(url + "/chat/completions", method="POST",
                                         data=json.dumps({"messages": HELLO, "stream": True}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "server_error"
        assert "choices" in json.loads(events[0])
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as response:
            metrics = response.read()
        assert b'strata_requests_total{endpoint="/v1/chat/completions",status="500"} 3' in metrics


def test_arguments_the_session_refuses_stay_a_client_error_streamed_or_not(tok):
    """An engine without log-probabilities refuses logprobs before it computes anything: 400, not 500."""
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url, client(url) as api:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                api.chat.completions.create(model="echo", messages=HELLO, logprobs=True, stream=stream)
            assert "log-probabilities" in refused.value.body["message"]
        assert api.chat.completions.create(model="echo", messages=HELLO).choices[0].message.content == "hello"


# ----------------------------------------------------------------------------------------- `strata serve`


def test_a_busy_port_or_a_bad_one_is_said_in_one_line_before_the_model_loads(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        missing = str(tmp_path / "absent.gguf")  # never opened: the port is refused first
        assert main(["serve", missing, "--engine", "reference", "--port", str(port)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err
    assert main(["serve", missing, "--engine", "reference", "--port", "99999"]) == 1
    err = capsys.readouterr().err
    assert err == "strata serve: port must be in 0..65535, got 99999\n"


@pytest.fixture(scope="module")
def untemplated(tmp_path_factory):
    """A model file without a chat template (as llama.cpp converts some)."""
    from strata.synth import tokenizer_meta

    made = tokenizer_meta.byte_level
    path = tmp_path_factory.mktemp("untemplated") / "bare.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokenizer_meta, "byte_level", lambda n_vocab, eos, chat: made(n_vocab, eos, chat=False))
        synthesize(path, "qwen3next", "tiny", seed=6)
    with inspect(path) as file:
        assert file.tokenizer().chat_template is None
    return path


def chat_cli(model, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strata.cli", "chat", str(model), "--engine", "reference",
                           "--context", "128", "-n", "3", *options], input="hello\n", capture_output=True,
                          text=True, timeout=120)


def test_strata_chat_refuses_a_model_without_a_template_unless_given_one(untemplated, tmp_path):
    refused = chat_cli(untemplated)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "carries no chat template" in refused.stderr and "--chat-template" in refused.stderr
    assert chat_cli(untemplated, "--chat-template", "chatml").returncode == 0
    custom = tmp_path / "plain.jinja"
    custom.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    answered = chat_cli(untemplated, "--chat-template-file", str(custom))
    assert answered.returncode == 0, answered.stderr
    both = chat_cli(untemplated, "--chat-template", "chatml", "--chat-template-file", str(custom))
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_strata_serve_warns_of_a_missing_template_and_takes_one(untemplated):
    def started(*options: str):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "strata.cli", "serve", str(untemplated), "--engine",
                                   "reference", "--port", str(port), "--context", "128", *options],
                                  stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                get(url, "/health", timeout=1)
                return server, url
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "strata serve did not start"
                time.sleep(0.1)

    def stopped(server) -> str:
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
        with server.stderr:
            return server.stderr.read()

    server, url = started()
    try:
        body = json.dumps({"messages": HELLO, "max_tokens": 2}).encode()
        status, answer = post(url, "/v1/chat/completions", body)
        assert status == 400 and answer["error"]["code"] == "chat_template_missing"
        assert post(url, "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode())[0] == 200
    finally:
        err = stopped(server)
    assert "carries no chat template" in err
    server, url = started("--chat-template", "chatml")
    try:
        assert post(url, "/v1/chat/completions", body)[0] == 200
    finally:
        assert "chat template" not in stopped(server)
