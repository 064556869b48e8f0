"""The live server driven from its published OpenAPI document (GET /openapi.json): request bodies generated from
the document's request schemas (hypothesis-jsonschema, field by field), and from each of them more requests (a
field of the wrong type, an unknown field, the body cut short or a byte changed, the body to the other route, its
text through /tokenize), then a corpus of hostile requests and clients that hang up mid-answer. Against the
reference engine on a one-layer synthetic model, over a real socket: no answer is a 5xx, none takes longer than
the client's timeout, each is valid against the document's schema for its route and status, and the server's
memory stays flat over rounds of the hostile corpus. Generated bodies keep max_tokens at 1 or 2 and at most 2
answers, so that each costs milliseconds; every limit is still exercised by the corpus."""

from __future__ import annotations

import gc
import json
import os
import socket
import threading

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

import strata
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize
from support.http_client import RawClient
from support.server_harness import wait_idle

CONTEXT = 64
EXAMPLES = 640  # each sends 8 requests: with the corpus, over 5,000 a run
TIMEOUT = 30.0  # seconds a request may take before the test fails (a hang)
ROUTES = ("/v1/chat/completions", "/v1/completions")
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "n", "prompt", "stream")
WRONG = [None, True, -1, 0, 2**40, 1.5, -1e300, "x", "", [], [1, "a"], {}, {"a": {"b": []}}]
MIB = 1 << 20


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema-fuzz") / "one-layer.gguf"
    synthesize(path, "qwen3next", "tiny", n_layer=1, seed=11)
    with strata.load(path, engine="reference") as model:
        server = Server([model.session(CONTEXT), model.session(CONTEXT)], "tiny", max_body_bytes=8 * MIB)
        with serving(server) as url:
            client = RawClient(url, TIMEOUT)
            answer = client.send("GET", "/openapi.json")
            assert answer.status == 200
            yield server, url, client, json.loads(answer.body)
            client.close()
        server.close()


class Schemas:
    """The document's schemas: each route's request body and its answers by status and content type."""

    def __init__(self, document: dict):
        self.document = document
        self.named = document["components"]["schemas"]
        self.validators = {name: jsonschema.Draft202012Validator(schema) for name, schema in self.named.items()}

    def _name(self, ref: dict) -> str:
        return ref["$ref"].rsplit("/", 1)[1]

    def request(self, route: str) -> dict:
        return self.named[self._name(self.document["paths"][route]["post"]["requestBody"]["content"]
                                     ["application/json"]["schema"])]

    def check(self, route: str, method: str, answer) -> None:
        """The answer is no 5xx, and valid against the document's schema for its route, status and type."""
        assert answer.status < 500, (route, answer.status, answer.body[:500])
        responses = self.document["paths"][route][method.lower()]["responses"]
        assert str(answer.status) in responses, (route, answer.status, answer.body[:300])
        content = responses[str(answer.status)]["content"]
        kind = answer.content_type.split(";")[0]
        assert kind in content, (route, answer.status, kind)
        validator = self.validators[self._name(content[kind]["schema"])]
        if kind != "text/event-stream":
            validator.validate(json.loads(answer.body))
            return
        events = [line[6:] for line in answer.body.decode().split("\n\n") if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", answer.body[-300:]
        for event in map(json.loads, events[:-1]):
            (self.validators["Error"] if "error" in event else validator).validate(event)


def _bodies(schema: dict) -> st.SearchStrategy:
    """Objects valid against `schema` (an object schema), drawn field by field from its properties."""
    fields, required = schema["properties"], schema["required"]
    return st.fixed_dictionaries({name: from_schema(fields[name]) for name in required},
                                 optional={name: from_schema(fields[name]) for name in fields if name not in required})


def _cheap(body: dict, tokens: int, answers: int) -> dict:
    """`body` with its length bounded (still valid against the schema): `tokens` at most, `answers` at most."""
    out = {k: v for k, v in body.items() if k not in ("max_completion_tokens", "n_predict")}
    out["max_tokens"] = tokens
    out["n"] = min(out.get("n") or 1, answers)
    if isinstance(out.get("prompt"), list) and out["prompt"] and not isinstance(out["prompt"][0], int):
        out["prompt"] = out["prompt"][:1]
    return out


def _text(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return "".join(m.get("content") if isinstance(m.get("content"), str) else "" for m in body.get("messages", []))


def test_generated_requests_get_no_5xx_and_answers_the_schema_allows(live):
    server, url, client, document = live
    schemas = Schemas(document)
    strategies = {route: _bodies(schemas.request(route)) for route in ROUTES}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def requests(data):
        route = data.draw(st.sampled_from(ROUTES))
        body = _cheap(data.draw(strategies[route]), data.draw(st.integers(1, 2)), 2)
        body["stream"] = data.draw(st.booleans())
        other = ROUTES[1 - ROUTES.index(route)]
        raw = json.dumps(body).encode()
        field = data.draw(st.sampled_from(sorted(set(schemas.request(route)["properties"]) - set(LENGTH_FIELDS))))
        wrong = {**body, field: data.draw(st.sampled_from(WRONG))}
        cut = data.draw(st.integers(0, len(raw) - 1))
        flipped = bytearray(raw)
        flipped[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        prompt = body.get("prompt")
        ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else [1, 2]
        sends = [(route, raw), (route, json.dumps(wrong).encode()), (route, json.dumps({**body, "zz": 1}).encode()),
                 (other, raw), (route, raw[:cut]), (route, bytes(flipped)),
                 ("/tokenize", json.dumps({"content": _text(body), "with_pieces": data.draw(st.booleans())}).encode()),
                 ("/detokenize", json.dumps({"tokens": ids}).encode())]
        for path, payload in sends:
            schemas.check(path, "POST", client.send("POST", path, payload))

    before = client.sent
    requests()
    assert client.sent - before >= 8 * EXAMPLES
    wait_idle(server)


def _hostile() -> list[tuple[str, bytes]]:
    """Requests that once ended in a 500 or worse, and their kin: each (route, body)."""
    chat, text = "/v1/chat/completions", "/v1/completions"
    hello = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    out = [
        (chat, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
        (text, b'{"prompt": "a\\udfffb", "max_tokens": 1}'),
        (chat, b'{"messages": [{"role": "user", "content": "hi", "\\ud83d": 1}]}'),
        (chat, b"[" * 100_000 + b"]" * 100_000),
        (chat, b"[" + b"[]," * 1_000_000 + b"[]]"),  # 3 MB that would parse into a million lists
        (text, b'{"prompt": ' + b"[" * 70 + b"1" + b"]" * 70 + b"}"),
        (text, b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"),
        (text, b'{"prompt": [' + b"1" * 5000 + b"]}"),
        (text, b'{"prompt": "hi", "temperature": 1e999}'),
        (text, b'{"prompt": "hi", "temperature": NaN}'),
        (text, b'{"prompt": "hi", "seed": -Infinity}'),
        (chat, b"\xff\xfe\x00 not utf-8"),
        (chat, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
        (chat, b""), (chat, b"null"), (chat, b"[]"), (chat, b'"messages"'), (chat, b"0"), (chat, b"{"),
        (text, json.dumps({"prompt": list(range(500)) * 1200, "max_tokens": 1}).encode()),  # 600,000 ids
        (chat, json.dumps({"messages": [{"role": "user", "content": "a"}] * 100_000}).encode()),
        (text, json.dumps({"prompt": ["x"] * 100_000}).encode()),
        (text, json.dumps({"prompt": "hi", "stop": ["s"] * 10_000}).encode()),
        (text, json.dumps({"prompt": "hi", "logit_bias": {str(i): 1 for i in range(20_000)}}).encode()),
        (chat, json.dumps({**hello, "messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]}]}).encode()),
        (chat, json.dumps({**hello, "messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": '{"a": ' + "7" * 5000 + "}"}}]}]}).encode()),
        (chat, json.dumps({**hello, "chat_template_kwargs": {"x": "{{ 7 * 7 }}" * 1000}}).encode()),
        (text, json.dumps({"prompt": "hi", "n": 16, "max_tokens": 1}).encode()),
        (text, json.dumps({"prompt": ["a", "b"], "n": 9}).encode()),
        ("/tokenize", b'{"content": "\\udc00"}'), ("/tokenize", b'{"content": 5}'), ("/tokenize", b"[]"),
        ("/detokenize", b'{"tokens": [99999999]}'), ("/detokenize", b'{"tokens": [-1]}'),
        ("/detokenize", b'{"tokens": [' + b"7" * 5000 + b"]}"), ("/detokenize", b'{"tokens": "1 2"}'),
        # structured output: grammars with no answer, or that the grammar engine cannot follow, or too large to build
        (text, json.dumps({"prompt": "hi", "max_tokens": 4, "json_schema": {"$ref": "#"}}).encode()),
        (text, json.dumps({"prompt": "hi", "max_tokens": 4, "grammar": 'root ::= root "a"'}).encode()),
        *((text, json.dumps({"prompt": "hi", "max_tokens": 4, "stream": stream, "json_schema": {
            "type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}).encode()) for stream in (0, 1)),
        (text, json.dumps({"prompt": "hi", "grammar": "root ::= r0\n" + "".join(
            f"r{i} ::= r{i + 1}\n" for i in range(5000)) + 'r5000 ::= "a"\n'}).encode()),
        (text, json.dumps({"prompt": "hi", "grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}).encode()),
        (text, json.dumps({"prompt": "hi", "max_tokens": 2, "grammar": 'root ::= "a"{1,99999}'}).encode()),
        (chat, json.dumps({**hello, "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "anyOf": [{"anyOf": [{"anyOf": [{"type": "null"}] * 60}] * 60}] * 60}}}}).encode()),
        (chat, json.dumps({**hello, "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "enum": [str(i) for i in range(9000)]}}}}).encode()),
        (chat, json.dumps({**hello, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "integer", "minimum": 1e300}}}], "tool_choice": "required"}).encode()),
    ]
    for route, schema_fields in ((chat, {**hello}), (text, {"prompt": "hi", "max_tokens": 1})):
        for field in ("model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                      "n", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty",
                      "repeat_penalty", "ignore_eos", "store", "metadata", "user", "logprobs", "cache_prompt",
                      "messages" if route == chat else "prompt", "tools", "tool_choice", "response_format",
                      "grammar", "json_schema"):
            for value in (True, 3, -7, 2.5, "x", [], ["x", 1], {}, {"a": None}):
                out.append((route, json.dumps({**schema_fields, field: value}).encode()))
    return out


def test_a_hostile_corpus_gets_4xx_and_memory_stays_flat(live):
    server, url, client, document = live
    schemas = Schemas(document)
    corpus = _hostile()
    for route, payload in corpus:
        schemas.check(route, "POST", client.send("POST", route, payload))
    deep = client.send("POST", "/v1/chat/completions", b"[" * 10_000 + b"]" * 10_000)
    assert deep.status == 400 and b"over 64 deep" in deep.body
    many = client.send("POST", "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert many.status == 400 and b"holds 100000 arrays and objects; at most 65536" in many.body
    # Memory over rounds of the whole corpus, its bodies of megabytes too: flat once the allocators hold what the
    # largest of them takes
    for rounds in (2, 5):
        if rounds == 5:
            gc.collect()
            before = _rss()
        for _ in range(rounds):
            for route, payload in corpus:
                assert client.send("POST", route, payload).status < 500
    gc.collect()
    assert _rss() - before <= 10 * MIB, f"RSS grew by {(_rss() - before) / MIB:.1f} MiB over 5 rounds"
    assert client.send("GET", "/health").status == 200


def test_a_refused_request_leaves_no_reference_cycle(live):
    """Its objects (the parsed body among them) are freed as it is answered: held by a cycle, a body of megabytes
    lived until the cyclic collector ran, and the allocations of the requests after it landed among its own."""
    server, url, client, document = live
    refused = [("/v1/completions", b'{"prompt": "hi", "temperature": 9}'),  # refused by a field
               ("/v1/completions", json.dumps({"prompt": list(range(500)) * 10}).encode()),  # refused for its length
               ("/v1/completions", b'{"prompt": "hi", "logit_bias": {"99999": 1}}'),  # refused by the session
               ("/tokenize", b'{"content": 5}')]
    gc.collect()
    gc.disable()
    try:
        for route, payload in refused:
            assert client.send("POST", route, payload).status == 400
        wait_idle(server)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_clients_that_hang_up_mid_answer_leave_the_server_serving(live):
    server, url, client, document = live
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    body = json.dumps({"prompt": "hello", "max_tokens": 40, "ignore_eos": True, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def hang_up(read: bool) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            sock.sendall(request if read else request[:-3])  # a body cut short, then gone
            if read:
                sock.recv(64)

    threads = [threading.Thread(target=hang_up, args=(i % 3 != 0,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    wait_idle(server, TIMEOUT)
    answer = client.send("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
    Schemas(document).check("/v1/completions", "POST", answer)
    assert answer.status == 200


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
