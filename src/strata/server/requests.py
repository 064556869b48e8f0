"""The OpenAI request bodies the server takes, checked field by field: an unknown field, a value of the wrong type
or out of range is a BadRequest naming the field (the OpenAI error's `param`), never a crash."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.generation import MAX_LOGPROBS, RANDOM_SEED


class BadRequest(Exception):
    """A client error: HTTP `status`, the OpenAI error's message, param and code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Call:
    """One generation a request asks for, in the terms strata.generation.Session takes."""

    kind: str                                   # "chat" or "completion"
    prompt: str | list[int] | None = None       # completions: text or token ids
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None               # None: until EOS or the context
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None                 # alternatives per token, None: no logprobs
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, min_p, repeat_penalty,
                                                             # seed, stop
    template_options: dict[str, Any] = field(default_factory=dict)

    def generate_options(self) -> dict[str, Any]:
        return {**self.sampling, "max_tokens": self.max_tokens, "logprobs": self.logprobs}


# OpenAI fields whose values here would change nothing, with the values accepted (a null, an empty or the
# default value; anything else asks for what the server does not do and is refused by name). Nothing is stored,
# so neither is metadata; there is one service tier, one modality, no bias, no predicted output.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "store": (None, False), "metadata": (None, {}), "logit_bias": (None, {}), "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,), "functions": (None, []),
    "function_call": (None, "auto", "none"), "reasoning_effort": (None,), "verbosity": (None,),
    "web_search_options": (None,), "best_of": (None, 1), "suffix": (None, ""),
}
# fields that only identify the caller or a cache (prefix reuse here is automatic): any string, or null
IDENTIFIERS = ("user", "prompt_cache_key", "safety_identifier")
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "seed", "stop", "n", "frequency_penalty", "presence_penalty", "logit_bias",
          "metadata", "store", "service_tier", *IDENTIFIERS}
CHAT = COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                 "parallel_tool_calls", "chat_template_kwargs", "response_format", "modalities", "audio",
                 "prediction", "functions", "function_call", "reasoning_effort", "verbosity", "web_search_options"}
COMPLETION = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
# the names the chat template is rendered with besides chat_template_kwargs (strata.chat.render_chat's own)
TEMPLATE_NAMES = {"template", "messages", "add_generation_prompt", "bos_token", "eos_token"}


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"'{key}' must be a number, got {value!r}", key, "invalid_type")
    if value < low or value > high or (low_open and value == low):
        interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise BadRequest(f"'{key}' must be in {interval}, got {value}", key, "invalid_value")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r}", key, "invalid_type")
    if value < low or (high is not None and value > high):
        raise BadRequest(f"'{key}' must be in {low}..{high if high is not None else ''}, got {value}", key,
                         "invalid_value")
    return value


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return stop
    raise BadRequest("'stop' must be a string or a list of up to 4 strings", "stop", "invalid_type")


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", None, "invalid_type")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}", unknown[0], "unknown_parameter")
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise BadRequest("'n' must be 1: the server generates one choice per request", "n", "invalid_value")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key, 0) not in (0, 0.0, None):
            raise BadRequest(f"'{key}' is not supported; use repetition_penalty", key, "unsupported_parameter")
    if not isinstance(body.get("stream", False), (bool, type(None))):
        raise BadRequest("'stream' must be true or false", "stream", "invalid_type")
    for key in set(NEUTRAL) & set(body):
        if not any(type(body[key]) is type(value) and body[key] == value for value in NEUTRAL[key]):
            accepted = " or ".join(json.dumps(value) for value in NEUTRAL[key])
            raise BadRequest(f"'{key}' is not supported here (accepted: {accepted})", key, "unsupported_parameter")
    for key in IDENTIFIERS:
        if not isinstance(body.get(key), (str, type(None))):
            raise BadRequest(f"'{key}' must be a string", key, "invalid_type")


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        "top_k": _integer(body, "top_k", 0) or 0,
        "min_p": _number(body, "min_p", 0.0, 0.0, 0.999999),
        "repeat_penalty": _number(body, "repetition_penalty", 1.0, 0.0, 10.0, low_open=True),
        "seed": _integer(body, "seed", RANDOM_SEED),  # -1: a fresh random seed, as in the API and the CLI
        "stop": _stop(body),
    }


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise BadRequest("'stream_options' takes only include_usage", "stream_options", "invalid_value")
    return bool(options.get("include_usage", False))


def _message(i: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant",
                                                                     "tool"):
        raise BadRequest(f"messages[{i}] must be an object with a role of system, user, assistant or tool",
                         f"messages[{i}]", "invalid_value")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise BadRequest(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content",
                             "invalid_value")
        content = "".join(p["text"] for p in content)
    if content is not None and not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string", f"messages[{i}].content", "invalid_type")
    out = {**message, "content": content or "", "role": "system" if message["role"] == "developer"
           else message["role"]}
    if out.get("tool_calls") is not None:
        if not isinstance(out["tool_calls"], list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list", f"messages[{i}]", "invalid_type")
        out["tool_calls"] = [_tool_call(i, call) for call in out["tool_calls"]]
    return out


def _tool_call(i: int, call: Any) -> dict[str, Any]:
    """An assistant message's tool call with its arguments as an object: the chat templates write them so."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest(f"messages[{i}].tool_calls: each needs a function with a name", f"messages[{i}]",
                         "invalid_value")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise BadRequest(f"messages[{i}].tool_calls: arguments are not JSON", f"messages[{i}]",
                             "invalid_value") from None
    return {**call, "function": {**function, "arguments": arguments}}


def parse_chat(body: Any) -> Call:
    _check_fields(body, CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages", "invalid_value")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("'tools' must be a list of tool objects", "tools", "invalid_type")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise BadRequest("'tool_choice' must be auto or none", "tool_choice", "unsupported_value")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise BadRequest("'response_format' must be text", "response_format", "unsupported_value")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type")
    if reserved := sorted(TEMPLATE_NAMES & set(kwargs)):
        raise BadRequest(f"'chat_template_kwargs' may not set {', '.join(reserved)}: the server renders the "
                         "template with its own", "chat_template_kwargs", "invalid_value")
    top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    wants = False if body.get("logprobs") is None else body["logprobs"]
    if not isinstance(wants, bool):
        raise BadRequest("'logprobs' must be true or false", "logprobs", "invalid_type")
    options = dict(kwargs)
    if tools and body.get("tool_choice") != "none":
        options["tools"] = tools
    return Call("chat", messages=[_message(i, m) for i, m in enumerate(messages)], tools=options.get("tools"),
                max_tokens=_integer(body, "max_completion_tokens", 1) or _integer(body, "max_tokens", 1),
                stream=bool(body.get("stream")), include_usage=_include_usage(body),
                logprobs=(top or 0) if wants else None, sampling=_sampling(body), template_options=options)


def parse_completion(body: Any) -> Call:
    _check_fields(body, COMPLETION)
    prompt = body.get("prompt")
    if not (isinstance(prompt, str) and prompt) and not (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                        for t in prompt)):
        raise BadRequest("'prompt' must be a non-empty string or list of token ids", "prompt", "invalid_value")
    if body.get("echo", False):
        raise BadRequest("'echo' is not supported", "echo", "unsupported_parameter")
    return Call("completion", prompt=prompt, max_tokens=_integer(body, "max_tokens", 1) or 16,
                stream=bool(body.get("stream")), include_usage=_include_usage(body),
                logprobs=_integer(body, "logprobs", 0, 5), sampling=_sampling(body))


def check_model(body: Mapping[str, Any], served: str) -> None:
    """A request that names a model names the one served (none named: that one); else 404 model_not_found, as
    OpenAI answers."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model", "invalid_type")
    if model is not None and model != served:
        raise BadRequest(f"the model {model!r} does not exist; this server serves {served!r}", "model",
                         "model_not_found", status=404)
