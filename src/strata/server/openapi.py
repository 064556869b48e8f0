"""The server's routes as an OpenAPI 3.1 document (`GET /openapi.json`): each request body and each answer as a
JSON Schema, self-contained (no $ref inside a schema, so each one validates or generates on its own). The schemas
say what a field's type and range must be; what they cannot say (a prompt that fits the context, token ids
within the vocabulary, repetition_penalty and repeat_penalty alike, n times the prompts at most MAX_CHOICES) the
server checks and refuses by name. tests/server/test_server_schema_fuzz.py holds the server to this document."""

from __future__ import annotations

from functools import cache
from typing import Any

import strata
from strata.generation import MAX_LOGPROBS
from strata.sampling import MAX_BIAS, MAX_PENALTY
from strata.server.requests import (
    IGNORED, JSON_SCHEMA_KEYS, MAX_CHOICES, MAX_STOPS, NEUTRAL, REPEAT_PENALTY, TEMPLATE_NAMES,
)
from strata.server.steering import MAX_SCALE

_JSON_TYPES = {bool: "boolean", dict: "object", str: "string", list: "array", int: "number", float: "number"}


def _null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _integer(low: int, high: int | None = None) -> dict[str, Any]:
    return _null({"type": "integer", "minimum": low, **({} if high is None else {"maximum": high})})


def _number(low: float, high: float, low_open: bool = False) -> dict[str, Any]:
    bound = {"exclusiveMinimum": low} if low_open else {"minimum": low}
    return _null({"type": "number", **bound, "maximum": high})


def _length() -> dict[str, Any]:
    """A token count: >= 1, or -1 (llama-server's: until EOS or the context)."""
    return {"anyOf": [{"type": "integer", "minimum": 1}, {"const": -1}, {"type": "null"}]}


def _neutral(name: str) -> dict[str, Any]:
    return {"enum": list(NEUTRAL[name])}


def _request(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": fields, "required": required, "additionalProperties": False}


_TEXT_PART = {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
              "required": ["type", "text"]}
_TOOL_CALL_IN = {"type": "object", "required": ["function"], "properties": {"function": {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "arguments": {"type": ["string", "object"]}}}}}
_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": _TEXT_PART}]},
    "tool_calls": _null({"type": "array", "items": _TOOL_CALL_IN})}}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
# a JSON schema the answer is held to (structured output): what the grammar engine cannot enforce is refused by name
_SCHEMA = {"type": ["object", "boolean"]}
_RESPONSE_FORMAT = {"anyOf": [
    {"type": "null"},
    {"type": "object", "properties": {"type": {"const": "text"}}, "required": ["type"], "additionalProperties": False},
    {"type": "object", "properties": {"type": {"const": "json_object"}, "schema": _null(_SCHEMA)},
     "required": ["type"], "additionalProperties": False},
    {"type": "object", "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "additionalProperties": False, "properties": {
            "name": _null({"type": "string"}), "description": _null({"type": "string"}), "schema": _null(_SCHEMA),
            "strict": _null({"type": "boolean"})}, "propertyNames": {"enum": sorted(JSON_SCHEMA_KEYS)}}},
     "required": ["type", "json_schema"], "additionalProperties": False}]}
_TOOL_CHOICE = {"anyOf": [{"enum": [None, "auto", "none", "required"]}, {
    "type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]}

COMMON_FIELDS: dict[str, Any] = {
    "model": _null({"type": "string"}),
    "stream": _null({"type": "boolean"}),
    "stream_options": _null({"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                             "additionalProperties": False}),
    "max_tokens": _length(),
    "n_predict": _length(),
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0, low_open=True),
    "top_k": _integer(0),
    "min_p": _number(0.0, 0.999999),
    "repetition_penalty": _number(*REPEAT_PENALTY),
    "repeat_penalty": _number(*REPEAT_PENALTY),
    "frequency_penalty": _number(-MAX_PENALTY, MAX_PENALTY),
    "presence_penalty": _number(-MAX_PENALTY, MAX_PENALTY),
    "logit_bias": {"anyOf": [
        {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,12}$"},
         "additionalProperties": {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS}},
        {"type": "array", "items": {"type": "array", "prefixItems": [
            {"type": "integer", "minimum": 0}, {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS}],
            "minItems": 2, "maxItems": 2}},
        {"type": "null"}]},
    "seed": _integer(-1),
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOPS},
                       {"type": "null"}]},
    "n": _integer(1, MAX_CHOICES),
    "ignore_eos": _null({"type": "boolean"}),
    "grammar": _null({"type": "string"}),  # llama-server's: GBNF
    "json_schema": _null(_SCHEMA),  # llama-server's
    # the control vectors the server loaded (GET /control-vectors), each at a scale: this request's steering
    "control_vectors": _null({"type": "array", "items": {
        "type": "object", "required": ["id"], "additionalProperties": False,
        "properties": {"id": {"type": "integer", "minimum": 0},
                       "scale": {"type": "number", "minimum": -MAX_SCALE, "maximum": MAX_SCALE}}}}),
    **{name: _null({"type": sorted({_JSON_TYPES[kind] for kind in kinds})}) for name, kinds in IGNORED.items()},
    **{name: _neutral(name) for name in ("service_tier", "typical_p", "mirostat", "dry_multiplier",
                                         "xtc_probability", "dynatemp_range", "top_n_sigma", "id_slot",
                                         "timings_per_token")},
}
CHAT_REQUEST = _request({
    **COMMON_FIELDS,
    "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
    "max_completion_tokens": _length(),
    "logprobs": _null({"type": "boolean"}),
    "top_logprobs": _integer(0, MAX_LOGPROBS),
    "tools": _null({"type": "array", "items": {"type": "object"}}),
    "tool_choice": _TOOL_CHOICE,
    "parallel_tool_calls": _null({"type": "boolean"}),
    "chat_template_kwargs": _null({"type": "object", "propertyNames": {"not": {"enum": sorted(TEMPLATE_NAMES)}}}),
    "response_format": _RESPONSE_FORMAT,
    **{name: _neutral(name) for name in ("modalities", "audio", "prediction", "functions", "function_call",
                                         "reasoning_effort", "verbosity", "web_search_options")},
}, ["messages"])
COMPLETION_REQUEST = _request({
    **COMMON_FIELDS,
    "prompt": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS,
                         {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
                          "items": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]}}]},
    "logprobs": _integer(0, 5),
    **{name: _neutral(name) for name in ("echo", "best_of", "suffix")},
}, ["prompt"])
TOKENIZE_REQUEST = _request({"content": {"type": "string"}, "add_special": {"type": "boolean"},
                             "parse_special": {"type": "boolean"}, "with_pieces": {"type": "boolean"}},
                            ["content"])
DETOKENIZE_REQUEST = _request({"tokens": {"type": "array", "items": {"type": "integer"}}}, ["tokens"])

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"enum": ["invalid_request_error", "server_error"]},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"], "properties": {
    "prompt_tokens": {"type": "integer", "minimum": 0}, "completion_tokens": {"type": "integer", "minimum": 0},
    "total_tokens": {"type": "integer", "minimum": 0},
    "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer", "minimum": 0}}}}}
_FINISH = {"enum": ["stop", "length", "tool_calls"]}
_TOKEN_LOGPROB = {"type": "object", "required": ["token", "logprob", "bytes"], "properties": {
    "token": {"type": "string"}, "logprob": {"type": "number"},
    "bytes": {"type": "array", "items": {"type": "integer"}}}}
_CHAT_LOGPROBS = _null({"type": "object", "required": ["content"], "properties": {"content": {
    "type": "array", "items": {**_TOKEN_LOGPROB, "properties": {
        **_TOKEN_LOGPROB["properties"], "top_logprobs": {"type": "array", "items": _TOKEN_LOGPROB}}}}}})
_TEXT_LOGPROBS = _null({"type": "object", "required": ["tokens", "token_logprobs", "top_logprobs"], "properties": {
    "tokens": {"type": "array", "items": {"type": "string"}},
    "token_logprobs": {"type": "array", "items": {"type": "number"}},
    "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}}}})
_TOOL_CALL_OUT = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"}, "index": {"type": "integer"},
    "function": {"type": "object", "required": ["name", "arguments"],
                 "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}


def _answer(kind: str, choice: dict[str, Any], usage: bool) -> dict[str, Any]:
    required = ["id", "object", "created", "model", "choices", *(["usage"] if usage else [])]
    return {"type": "object", "required": required,
            "properties": {"id": {"type": "string"}, "object": {"const": kind},
                           "created": {"type": "integer"}, "model": {"type": "string"},
                           "choices": {"type": "array", "items": {"type": "object", **choice}},
                           "usage": _USAGE}}


def _choice(fields: dict[str, Any], finish: dict[str, Any]) -> dict[str, Any]:
    return {"required": ["index", *fields, "finish_reason"],
            "properties": {"index": {"type": "integer", "minimum": 0}, **fields, "finish_reason": finish}}


CHAT_COMPLETION = _answer("chat.completion", _choice({"message": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                   "tool_calls": {"type": "array", "items": _TOOL_CALL_OUT}}}, "logprobs": _CHAT_LOGPROBS},
    _FINISH), usage=True)
CHAT_CHUNK = _answer("chat.completion.chunk", _choice({"delta": {
    "type": "object", "properties": {"role": {"const": "assistant"}, "content": {"type": "string"},
                                     "tool_calls": {"type": "array", "items": _TOOL_CALL_OUT}}},
    "logprobs": _CHAT_LOGPROBS}, _null(_FINISH)), usage=False)
COMPLETION = _answer("text_completion", _choice({"text": {"type": "string"}, "logprobs": _TEXT_LOGPROBS}, _FINISH),
                     usage=True)
COMPLETION_CHUNK = _answer("text_completion", _choice({"text": {"type": "string"}, "logprobs": _TEXT_LOGPROBS},
                                                      _null(_FINISH)), usage=False)
MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
    "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
    "owned_by": {"type": "string"}}}
MODELS = {"type": "object", "required": ["object", "data"],
          "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}}}
HEALTH = {"type": "object", "required": ["status", "sessions", "busy", "waiting"], "properties": {
    "status": {"const": "ok"}, **{k: {"type": "integer", "minimum": 0} for k in ("sessions", "busy", "waiting")}}}
PROPS = {"type": "object", "required": ["default_generation_settings", "total_slots", "chat_template", "build_info"],
         "properties": {"default_generation_settings": {
             "type": "object", "required": ["n_ctx", "params"],
             "properties": {"n_ctx": {"type": "integer"}, "params": {"type": "object"}}},
             "total_slots": {"type": "integer"}, "model_alias": {"type": "string"},
             "model_path": {"type": "string"}, "chat_template": {"type": "string"},
             "modalities": {"type": "object"}, "build_info": {"type": "string"}}}
TOKENIZED = {"type": "object", "required": ["tokens"], "properties": {"tokens": {"anyOf": [
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "items": {"type": "object", "required": ["id", "piece"], "properties": {
        "id": {"type": "integer"},
        "piece": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}}}}]}}}
DETOKENIZED = {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}
CONTROL_VECTORS = {"type": "array", "items": {"type": "object", "required": ["id", "name", "scale"], "properties": {
    "id": {"type": "integer", "minimum": 0}, "name": {"type": "string"}, "scale": {"type": "number"}}}}

SCHEMAS = {"ChatRequest": CHAT_REQUEST, "CompletionRequest": COMPLETION_REQUEST, "TokenizeRequest": TOKENIZE_REQUEST,
           "DetokenizeRequest": DETOKENIZE_REQUEST, "Error": ERROR, "ChatCompletion": CHAT_COMPLETION,
           "ChatCompletionChunk": CHAT_CHUNK, "Completion": COMPLETION, "CompletionChunk": COMPLETION_CHUNK,
           "Model": MODEL, "ModelList": MODELS, "Health": HEALTH, "Props": PROPS, "Tokenized": TOKENIZED,
           "Detokenized": DETOKENIZED, "ControlVectors": CONTROL_VECTORS}
# Statuses a route answers with the Error object: 400 a bad request, 401 no valid key, 404 not found, 413 a body
# too large, 429 the queue full, 500 the model's or the server's own fault.
ERROR_STATUSES = ("400", "401", "404", "413", "429", "500")


def _json(name: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


def _operation(summary: str, answer: str, request: str | None = None, stream: str | None = None,
               errors: tuple[str, ...] = ERROR_STATUSES) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "the answer", **_json(answer)}
    if stream is not None:  # each `data:` line of the stream is one of these (or an Error), then `data: [DONE]`
        ok["content"]["text/event-stream"] = {"schema": {"$ref": f"#/components/schemas/{stream}"}}
    operation: dict[str, Any] = {"summary": summary, "responses": {
        "200": ok, **{status: {"description": "an error", **_json("Error")} for status in errors}}}
    if request is not None:
        operation["requestBody"] = {"required": True, **_json(request)}
    return operation


@cache
def document() -> dict[str, Any]:
    """The OpenAPI document (one object, built once)."""
    paths = {
        "/v1/chat/completions": {"post": _operation("the model's chat template over messages; stream: server-sent "
                                                    "events", "ChatCompletion", "ChatRequest", "ChatCompletionChunk")},
        "/v1/completions": {"post": _operation("a prompt (or several) continued, no template", "Completion",
                                               "CompletionRequest", "CompletionChunk")},
        "/v1/models": {"get": _operation("the one model served", "ModelList", errors=("401",))},
        "/v1/models/{model}": {"get": {**_operation("the model by its id", "Model", errors=("401", "404")),
                                       "parameters": [{"name": "model", "in": "path", "required": True,
                                                       "schema": {"type": "string"}}]}},
        "/tokenize": {"post": _operation("text to token ids (llama-server's)", "Tokenized", "TokenizeRequest",
                                         errors=("400", "401", "413"))},
        "/detokenize": {"post": _operation("token ids to text (llama-server's)", "Detokenized", "DetokenizeRequest",
                                           errors=("400", "401", "413"))},
        "/props": {"get": _operation("the server's settings (llama-server's)", "Props", errors=("401",))},
        "/control-vectors": {"get": _operation("the control vectors a request may name in control_vectors",
                                               "ControlVectors", errors=("401",))},
        "/health": {"get": _operation("for probes: no key needed", "Health", errors=())},
        "/metrics": {"get": {"summary": "Prometheus text", "responses": {
            "200": {"description": "the counters", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "401": {"description": "an error", **_json("Error")}}}},
        "/openapi.json": {"get": {"summary": "this document", "responses": {
            "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}},
            "401": {"description": "an error", **_json("Error")}}}},
    }
    return {"openapi": "3.1.0",
            "info": {"title": "strata serve", "version": strata.__version__,
                     "description": "An OpenAI-compatible server (with llama-server's tokenize, detokenize and "
                                    "props) over strata's sessions; docs/server.md describes every field."},
            "paths": paths, "components": {"schemas": SCHEMAS,
                                           "securitySchemes": {"key": {"type": "http", "scheme": "bearer"}}},
            "security": [{}, {"key": []}]}
