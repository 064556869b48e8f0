"""What clients written for OpenAI, vLLM and llama-server send, against a live server on the reference engine:
n choices and lists of prompts (each its own generation), logit_bias and the penalties applied as the sampler
defines them, ignore_eos, /tokenize, /detokenize, /props, /openapi.json, CORS, the key's scheme in any case, the
access log and its request ids, a fault of the server's own logged once and answered without its text, the C
allocator's free memory given back after a large body, and kept-alive connections answered without Nagle's
delay."""

from __future__ import annotations

import json
import logging
import statistics
import time

import pytest

import strata
from strata.server import Server, access
from strata.server.background import serving
from strata.synth import synthesize
from support.http_client import RawClient
from support.server_harness import client

CONTEXT = 64


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("server-fields") / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", n_layer=1, seed=13)
    with strata.load(path, engine="reference") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def live(model):
    server = Server([model.session(CONTEXT)], "tiny", api_key="sesame", cors_origins=["http://ui.example"])
    with serving(server) as url:
        raw = RawClient(url)
        yield url, raw, model.session(CONTEXT)
        raw.close()
    server.close()


KEY = {"Authorization": "bearer sesame"}  # the scheme in lower case, as some clients write it


def post(raw: RawClient, path: str, body: dict) -> tuple[int, dict]:
    answer = raw.send("POST", path, json.dumps(body).encode(), KEY)
    return answer.status, json.loads(answer.body)


def test_n_choices_and_prompt_lists_are_each_their_own_generation(live):
    url, raw, alone = live
    status, answer = post(raw, "/v1/completions", {"prompt": ["one two", "three"], "n": 2, "max_tokens": 3,
                                                   "temperature": 1.0, "seed": 5})
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    for index, choice in enumerate(answer["choices"]):
        want = alone.complete(["one two", "three"][index // 2], max_tokens=3, temperature=1.0, seed=5 + index % 2)
        assert choice["text"] == want.text
    prompts = len(alone.codec.encode("one two")) + len(alone.codec.encode("three"))
    assert answer["usage"]["prompt_tokens"] == prompts  # each prompt counted once, not per choice
    with client(url, "sesame") as api:
        chat = api.chat.completions.create(model="any-name", messages=[{"role": "user", "content": "hi"}], n=3,
                                           max_tokens=2, seed=1, temperature=1.0)
        assert [c.index for c in chat.choices] == [0, 1, 2]
        chunks = list(api.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], n=2,
                                                  max_tokens=2, stream=True))
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
        assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 2


def test_logit_bias_penalties_and_ignore_eos_apply_as_the_sampler_defines_them(live):
    url, raw, alone = live
    status, answer = post(raw, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "logit_bias": {"42": 100}})
    assert status == 200 and answer["choices"][0]["text"] == alone.codec.decode([42] * 4), answer
    options = {"frequency_penalty": 1.5, "presence_penalty": -0.5, "max_tokens": 5, "temperature": 0.0}
    status, answer = post(raw, "/v1/completions", {"prompt": "hello", **options})
    assert answer["choices"][0]["text"] == alone.complete("hello", **options).text
    eos = alone.codec.eos_ids[0]
    status, answer = post(raw, "/v1/completions", {"prompt": "hello", "max_tokens": 3, "ignore_eos": True,
                                                   "logit_bias": [[eos, 100]]})
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 3


def test_tokenize_detokenize_and_props_answer_as_llama_server(live):
    url, raw, alone = live
    status, tokens = post(raw, "/tokenize", {"content": "hello world"})
    assert status == 200 and tokens["tokens"] == alone.codec.encode("hello world")
    status, pieces = post(raw, "/tokenize", {"content": "hé", "with_pieces": True})
    assert "".join(p["piece"] for p in pieces["tokens"] if isinstance(p["piece"], str)) or pieces["tokens"]
    assert post(raw, "/detokenize", tokens) == (200, {"content": "hello world"})
    status, refused = post(raw, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and refused["error"]["param"] == "tokens"
    props = json.loads(raw.send("GET", "/props", None, KEY).body)
    assert props["default_generation_settings"]["n_ctx"] == CONTEXT and props["total_slots"] == 1
    assert "<|im_start|>" in props["chat_template"]
    document = json.loads(raw.send("GET", "/openapi.json", None, KEY).body)
    assert document["openapi"].startswith("3.1") and "/v1/chat/completions" in document["paths"]


def test_cors_lets_the_origin_given_call_and_answers_its_preflight_without_a_key(live):
    url, raw, alone = live
    preflight = raw.send("OPTIONS", "/v1/chat/completions", None, {
        "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status == 200
    connection = raw.connection
    raw.send("GET", "/v1/models", None, {**KEY, "Origin": "http://ui.example"})
    # the header is read from a fresh request on the same connection (RawClient keeps only the answer's body)
    connection.request("GET", "/v1/models", headers={**KEY, "Origin": "http://ui.example"})
    response = connection.getresponse()
    response.read()
    assert response.getheader("access-control-allow-origin") == "http://ui.example"
    assert response.getheader("x-request-id")
    assert raw.send("GET", "/v1/models", None, {"Authorization": "Basic sesame"}).status == 401


def test_each_request_is_logged_once_with_its_id_and_a_fault_of_the_server_is_a_bare_500(model, caplog):
    class Broken(type(model.session(CONTEXT))):
        def chat_ids(self, *args, **kwargs):
            raise ZeroDivisionError("the server's own secret")

    session = model.session(CONTEXT)
    session.__class__ = Broken
    server = Server([session], "tiny")
    with caplog.at_level(logging.INFO, logger="strata.server"), serving(server) as url:
        raw = RawClient(url)
        status, answer = post(raw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 500 and answer["error"]["code"] == "internal_error"
        assert "secret" not in json.dumps(answer)
        post(raw, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})  # sampled: no early EOS
        raw.close()
    server.close()
    failures = [r for r in caplog.records if r.name == "strata.server" and r.exc_info]
    assert len(failures) == 1 and "ZeroDivisionError" in caplog.text
    # this test's lines (another test's server may log its last request's line late, into this capture)
    lines = [r.getMessage() for r in caplog.records if r.name == "strata.server.access"
             and r.getMessage().startswith("POST ")]
    assert lines[0].startswith("POST /v1/chat/completions 500 ") and "id=" in lines[0]
    assert lines[1].startswith("POST /v1/completions 200 prompt=") and "generated=2" in lines[1]
    request_id = lines[0].rsplit("id=", 1)[1]
    assert request_id in answer["error"]["message"] and request_id in failures[0].getMessage()


def test_the_c_allocator_gives_back_what_a_large_body_took_once_its_request_is_done(live, monkeypatch):
    url, raw, alone = live
    trims = []
    monkeypatch.setattr(access, "_malloc_trim", trims.append)
    large = {"prompt": "x" * access.TRIM_BODY_BYTES, "max_tokens": 1}  # refused: longer than the context holds
    assert post(raw, "/v1/completions", large)[0] == 400
    assert post(raw, "/v1/completions", {"prompt": "hi", "max_tokens": 1})[0] == 200
    assert raw.send("POST", "/v1/completions", b"x" * (2 * access.TRIM_BODY_BYTES), KEY).status == 400
    assert raw.send("GET", "/health").status == 200  # on the same connection: after the request before is done
    assert trims == [0, 0]  # the large bodies', after their answers; not the small ones'


def test_kept_alive_connections_are_answered_without_nagles_delay(live):
    """Every answer on a kept-alive connection after its first used to wait 40 ms (the client's delayed ACK)."""
    url, raw, alone = live
    times = []
    for _ in range(15):
        start = time.perf_counter()
        assert raw.send("GET", "/health").status == 200
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.02, times


def test_a_client_written_for_llama_server_works_unchanged(live):
    """What llama.cpp's web UI sends with every message (its samplers' settings, off ones included), and the
    routes it and other llama-server clients read first."""
    url, raw, alone = live
    assert raw.send("GET", "/health").status == 200
    props = json.loads(raw.send("GET", "/props", None, KEY).body)
    assert props["default_generation_settings"]["n_ctx"] == CONTEXT
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "cache_prompt": True,
            "samplers": "edkypmxt", "temperature": 0.8, "dynatemp_range": 0, "dynatemp_exponent": 1, "top_k": 40,
            "top_p": 0.95, "min_p": 0.05, "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1,
            "repeat_last_n": 64, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0,
            "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
            "max_tokens": -1, "timings_per_token": False}
    answer = raw.send("POST", "/v1/chat/completions", json.dumps(body).encode(), KEY)
    assert answer.status == 200, answer.body
    events = [line[6:] for line in answer.body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    status, refused = post(raw, "/v1/chat/completions", {**body, "stream": False, "dry_multiplier": 0.8})
    assert status == 400 and refused["error"]["param"] == "dry_multiplier"
    status, tokens = post(raw, "/tokenize", {"content": "hi", "with_pieces": True})
    assert status == 200 and "".join(t["piece"] for t in tokens["tokens"]) == "hi"
