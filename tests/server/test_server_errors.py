"""What a client can get wrong, against a live server: every bad request is a 4xx OpenAI-style JSON error that
names the field, the API key is enforced where one is set, and the server answers normally afterwards."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from support.server_harness import client, echo_session
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize
from strata.format import inspect

CONTEXT = 256
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("server-errors") / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", seed=5)
    with inspect(path) as file:
        yield file.tokenizer()


@pytest.fixture(scope="module")
def url(tok):
    server = Server([echo_session(tok, CONTEXT)], "echo")
    with serving(server) as url:
        yield url


def raw(url: str, path: str, body: bytes | None, method: str = "POST", headers: dict | None = None
        ) -> tuple[int, dict]:
    request = urllib.request.Request(url.removesuffix("/v1") + path, data=body, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.mark.parametrize("body, param, code", [
    (b'{"model": "echo", "messages": [', None, "invalid_json"),
    (b'\xff\xfe not utf-8', None, "invalid_json"),
    (b'[1, 2]', None, "invalid_type"),
    (b'{"model": "echo"}', "messages", "invalid_value"),
    (b'{"messages": []}', "messages", "invalid_value"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0]", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content",
     "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "bogus": 1}', "bogus", "unknown_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 5}', "temperature", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "temperature", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}', "top_p", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "min_p": -1}', "min_p", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_k": -3}', "top_k", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5}', "max_tokens", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": true}', "seed", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -2}', "seed", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 17}', "n", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 0}', "n", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": [1]}', "stop", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 99}', "top_logprobs",
     "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 3}', "frequency_penalty",
     "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}', "logit_bias", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}}', "logit_bias", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999": 1}}', "logit_bias",
     "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "ignore_eos": "yes"}', "ignore_eos", "invalid_type"),
    (b'{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", '
     b'"arguments": "{not json"}}]}]}', "messages[0]", "invalid_value"),
    (b'{"messages": [{"role": "assistant", "content": "", "tool_calls": 7}]}', "messages[0]", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}}',
     "chat_template_kwargs", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": false, '
     b'"template": "x"}}', "chat_template_kwargs", "invalid_value"),
])
def test_a_bad_chat_request_is_a_400_that_names_the_field(url, body, param, code):
    status, answer = raw(url, "/v1/chat/completions", body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["code"] == code, answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": ""}', "prompt"),
    (b'{"prompt": [1, "a"]}', "prompt"),
    (b'{"prompt": [999999]}', "prompt"),
    (b'{"prompt": "hi", "logprobs": 9}', "logprobs"),
    (b'{"prompt": "hi", "echo": true}', "echo"),
    (b'{"prompt": ["a", ""]}', "prompt"),
    (b'{"prompt": ["a", 3]}', "prompt"),
    (b'{"prompt": ["a", "b", "c"], "n": 6}', "n"),
    (b'{"prompt": "hi", "n_predict": 0}', "n_predict"),
])
def test_a_bad_completion_request_is_a_400(url, body, param):
    status, answer = raw(url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_a_prompt_over_the_context_is_refused_before_it_runs(url):
    with client(url) as api, pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="echo", messages=[{"role": "user", "content": "many words " * 300}])
    assert refused.value.body["code"] == "context_length_exceeded"
    assert f"the context holds {CONTEXT}" in refused.value.body["message"]


def test_unknown_routes_and_methods_answer_json(url):
    assert raw(url, "/v1/embeddings", b"{}")[0] == 404
    status, answer = raw(url, "/v1/chat/completions", None, method="GET")
    assert status == 405 and answer["error"]["code"] == "method_not_allowed"


def test_the_server_answers_normally_after_bad_requests(url):
    with client(url) as api:
        assert api.chat.completions.create(model="echo", messages=HELLO).choices[0].message.content == "hello"


def test_an_api_key_is_required_where_one_is_set(tok):
    server = Server([echo_session(tok, CONTEXT)], "echo", api_key="sesame")
    with serving(server) as url:
        with client(url, "wrong") as api, pytest.raises(openai.AuthenticationError) as refused:
            api.chat.completions.create(model="echo", messages=HELLO)
        assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
        for path in ("/v1/models", "/metrics"):
            assert raw(url, path, None, method="GET")[0] == 401
        status, answer = raw(url, "/v1/completions", b'{"prompt": "hi"}')
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
        assert raw(url, "/health", None, method="GET")[0] == 200  # for load balancers' probes
        with client(url, "sesame") as api:
            assert api.chat.completions.create(model="echo", messages=HELLO).choices[0].message.content == "hello"
            assert [m.id for m in api.models.list().data] == ["echo"]
