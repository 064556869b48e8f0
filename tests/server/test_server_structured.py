"""Structured output through `strata serve` (the reference engine on a tiny random model, whose text unconstrained is
noise): OpenAI's response_format (json_object, json_schema strict or not) and the official client's parse() with
pydantic models, tools that must be called (tool_choice required or a function named) with arguments held to the
tool's parameters, llama-server's grammar and json_schema fields, logprobs over the allowed tokens; what cannot be
enforced answered 400 naming the field and what it cannot take, before any token, as is any constraint on an
engine whose sampler takes no mask."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from strata.api import load
from strata.generation import Session
from strata.server import Server
from strata.server.background import serving
from strata.server.requests import BadRequest, parse_chat, parse_completion
from support.char_engine import ScriptedEngine
from support.http_client import RawClient
from support.server_harness import client

pytest.importorskip("llguidance")

CONTEXT = 1024
USER = [{"role": "user", "content": "Fill it in."}]
Word = Annotated[str, Field(max_length=5)]


class Pet(BaseModel):
    name: Word
    species: Literal["cat", "dog", "fish"]


class Person(BaseModel):
    name: Word
    age: int = Field(ge=0, le=130)
    email: str = Field(pattern=r"^[a-z]{1,6}@example\.com$")
    pets: list[Pet] = Field(max_length=2)
    nickname: Word | None
    score: float = Field(ge=0, le=1)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 8},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def model(tiny_model):
    with load(tiny_model("qwen3next", seed=4), engine="reference") as model:
        yield model


@pytest.fixture(scope="module")
def live(model):
    server = Server([model.session(CONTEXT), model.session(CONTEXT)], "tiny")
    with serving(server) as url, client(url) as api:
        yield url, api, server
    server.close()


def test_the_official_clients_parse_with_a_pydantic_model(live):
    url, api, server = live
    for seed in range(3):
        completion = api.chat.completions.parse(model="tiny", messages=USER, response_format=Person, seed=seed,
                                                temperature=1.0, max_tokens=400)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person), choice.message.content
    beta = api.beta.chat.completions.parse(model="tiny", messages=USER, response_format=Pet, temperature=0.0)
    assert isinstance(beta.choices[0].message.parsed, Pet)


def test_response_format_json_schema_and_json_object(live):
    url, api, server = live
    schema = {"type": "object", "additionalProperties": False, "required": ["ok", "items"],
              "properties": {"ok": {"type": "boolean"},
                             "items": {"type": "array", "maxItems": 3, "items": {"type": "integer", "maximum": 99,
                                                                                 "minimum": -99}}}}
    for strict in (True, False, None):
        spec = {"name": "answer", "schema": schema, **({} if strict is None else {"strict": strict})}
        for stream in (False, True):
            reply = api.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=3, stream=stream,
                                                response_format={"type": "json_schema", "json_schema": spec})
            text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices) if stream \
                else reply.choices[0].message.content
            jsonschema.validate(json.loads(text), schema)
    reply = api.chat.completions.create(model="tiny", messages=USER, n=2, temperature=1.0, seed=1, max_tokens=300,
                                        response_format={"type": "json_object"},
                                        logit_bias={str(ord('"')): 4, str(ord("}")): 4})
    for choice in reply.choices:
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content
    text = api.chat.completions.create(model="tiny", messages=USER, max_tokens=6, temperature=0.0,
                                       response_format={"type": "text"})
    assert text.choices[0].finish_reason == "length"


def test_a_tool_must_be_called_when_required_or_named(live):
    url, api, server = live
    arguments = jsonschema.Draft202012Validator(WEATHER["function"]["parameters"])
    names = set()
    for seed in range(4):
        reply = api.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, CLOCK], seed=seed,
                                            tool_choice="required", temperature=1.0, max_tokens=300)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message.content
        for call in choice.message.tool_calls:
            names.add(call.function.name)
            if call.function.name == "get_weather":
                arguments.validate(json.loads(call.function.arguments))
            else:
                assert json.loads(call.function.arguments) == {}
    assert names <= {"get_weather", "get_time"}
    for stream in (False, True):
        reply = api.chat.completions.create(
            model="tiny", messages=USER, tools=[WEATHER, CLOCK], temperature=1.0, seed=9, stream=stream,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
        if stream:
            chunks = list(reply)
            calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        else:
            calls = reply.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        arguments.validate(json.loads(calls[0].function.arguments))


def test_llama_servers_grammar_and_json_schema_fields(live):
    url, api, server = live
    gbnf = 'root ::= ("yes" | "no") " " [0-9]{2}\n'
    for seed in range(3):
        text = api.completions.create(model="tiny", prompt="Answer:", max_tokens=40, temperature=1.0, seed=seed,
                                      extra_body={"grammar": gbnf}).choices[0].text
        assert re.fullmatch(r"(yes|no) [0-9]{2}", text), text
        chat = api.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=seed,
                                           extra_body={"json_schema": Pet.model_json_schema()})
        Pet.model_validate_json(chat.choices[0].message.content)
    same = api.completions.create(model="tiny", prompt="Answer:", max_tokens=4, temperature=0.0,
                                  extra_body={"grammar": ""})  # an empty grammar is none, as llama-server reads it
    assert same.choices[0].finish_reason == "length"


def test_logprobs_of_a_constrained_answer_are_over_the_allowed_tokens(live):
    url, api, server = live
    reply = api.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=2, logprobs=True,
                                        top_logprobs=5, extra_body={"grammar": 'root ::= "yes" | "no"'})
    first = reply.choices[0].logprobs.content[0]
    assert reply.choices[0].message.content in ("yes", "no")
    assert {t.token for t in first.top_logprobs} <= {"y", "n"}
    assert abs(sum(2.718281828459045 ** t.logprob for t in first.top_logprobs) - 1) < 1e-6


def test_what_cannot_be_enforced_is_a_400_naming_it_before_any_token(live):
    url, api, server = live
    raw = RawClient(url)
    generated = server.metrics.generated_tokens
    cases = [
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "if": {"required": ["a"]}}}}}, "response_format", '"if"'),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format", "uniqueItems"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}}, "response_format", "look-around"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#"}}}}, "response_format", "allows no answer"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format", "json_object"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {},
                                                                                            "strictly": True}}},
         "response_format", "strictly"),
        ("/v1/completions", {"grammar": "root ::= nothing"}, "grammar", "nothing"),
        ("/v1/completions", {"grammar": 7}, "grammar", "GBNF"),
        ("/v1/completions", {"json_schema": {"type": "object", "not": {}}}, "json_schema", '"not"'),
        ("/v1/completions", {"grammar": 'root ::= "a"', "json_schema": {}}, "json_schema", "give one"),
        ("/v1/completions", {"grammar": 'root ::= "a"', "ignore_eos": True}, "ignore_eos", "where the answer ends"),
        ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                      "function": {"name": "nope"}}},
         "tool_choice", "no tool named"),
        ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice", "no 'tools'"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "format": "hostname-ish"}}}}}],
                                  "tool_choice": "required"}, "tool_choice", "format"),
        ("/v1/chat/completions", {"tools": [{"function": {}}], "tool_choice": "required"}, "tools", "tools\\[0\\]"),
        ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": "required",
                                  "response_format": {"type": "json_object"}}, "tool_choice", "give one"),
    ]
    for route, fields, param, words in cases:
        body = {**({"messages": USER} if "chat" in route else {"prompt": "hi"}), **fields}
        answer = raw.send("POST", route, json.dumps(body).encode())
        error = json.loads(answer.body)["error"]
        assert answer.status == 400 and error["param"] == param and re.search(words, error["message"]), (fields, error)
    raw.close()
    assert server.metrics.generated_tokens == generated  # none of them generated a token


class NoMask(ScriptedEngine):
    """An engine whose sampler takes no token mask (a Session's engine need not have one)."""


def test_an_engine_that_cannot_mask_refuses_every_constraint_by_its_field(model):
    server = Server([Session(NoMask([1, 2, 3], context=64), model.tokenizer)], "nomask")
    with serving(server) as url:
        raw = RawClient(url)
        for route, fields, param in (
                ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
                ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
                ("/v1/completions", {"grammar": 'root ::= "a"'}, "grammar"),
                ("/v1/completions", {"json_schema": {"type": "integer"}}, "json_schema")):
            body = {**({"messages": USER} if "chat" in route else {"prompt": "hi"}), **fields}
            answer = raw.send("POST", route, json.dumps(body).encode())
            error = json.loads(answer.body)["error"]
            assert answer.status == 400 and error["param"] == param and "token mask" in error["message"], error
            assert error["code"] == "unsupported_parameter"
        raw.close()
    server.close()


def test_batched_sessions_each_hold_their_own_constraint(model):
    """--batch 2: two requests at once, one under a schema and one free, each answered as alone."""
    from concurrent.futures import ThreadPoolExecutor

    schema = Pet.model_json_schema()
    alone = model.session(CONTEXT)
    want_json = alone.chat_complete(USER, 200, json_schema=schema, temperature=1.0, seed=4).text
    want_free = alone.chat_complete(USER, 12, temperature=1.0, seed=5).text
    server = Server([model.session(CONTEXT), model.session(CONTEXT)], "tiny", batch=2)
    with serving(server) as url, client(url) as api, ThreadPoolExecutor(2) as pool:
        constrained = pool.submit(api.chat.completions.create, model="tiny", messages=USER, max_tokens=200,
                                  temperature=1.0, seed=4, extra_body={"json_schema": schema})
        free = pool.submit(api.chat.completions.create, model="tiny", messages=USER, max_tokens=12,
                           temperature=1.0, seed=5)
        assert constrained.result().choices[0].message.content == want_json
        assert free.result().choices[0].message.content == want_free
    server.close()
    Pet.model_validate_json(want_json)


def test_request_bodies_name_their_constraint():
    chat = {"messages": USER}
    assert parse_chat(chat).constraint is None
    assert parse_chat({**chat, "response_format": {"type": "text"}}).constraint is None
    made = parse_chat({**chat, "response_format": {"type": "json_object"}}).constraint
    assert (made.field, made.kind, made.source) == ("response_format", "json_schema", {"type": "object"})
    schema = {"type": "integer"}
    made = parse_chat({**chat, "response_format": {"type": "json_object", "schema": schema}}).constraint
    assert made.source == schema  # llama-server's json_object with a schema
    made = parse_chat({**chat, "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "description": "d", "strict": True, "schema": schema}}}).constraint
    assert made.source == schema
    made = parse_completion({"prompt": "x", "grammar": 'root ::= "a"'}).constraint
    assert (made.field, made.kind) == ("grammar", "gbnf")
    assert parse_completion({"prompt": "x", "json_schema": schema}).constraint.source == schema
    with pytest.raises(BadRequest, match="give one") as refused:
        parse_completion({"prompt": "x", "grammar": 'root ::= "a"', "json_schema": schema})
    assert refused.value.param == "json_schema"
    for bad in (True, 3, "json", [], {}, {"type": "json_schema", "json_schema": []},
                {"type": "json_schema", "json_schema": {"name": 3}}, {"type": "text", "schema": {}}):
        with pytest.raises(BadRequest) as refused:
            parse_chat({**chat, "response_format": bad})
        assert refused.value.param == "response_format"
    with pytest.raises(BadRequest) as refused:
        parse_chat({**chat, "tools": [WEATHER], "tool_choice": {"type": "function"}})
    assert refused.value.param == "tool_choice"
