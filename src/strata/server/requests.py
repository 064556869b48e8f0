"""The OpenAI request bodies the server takes (and the fields llama-server's clients send), checked field by field:
an unknown field, a value of the wrong type or out of range is a BadRequest naming the field (the OpenAI error's
`param`), never a crash. docs/server.md lists them; strata.server.openapi publishes them as a schema."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.generation import MAX_LOGPROBS, RANDOM_SEED
from strata.sampling import MAX_BIAS, MAX_PENALTY
from strata.server.body import read_json
from strata.server.errors import BadRequest
from strata.server.steering import parse_control_vectors
from strata.server.tools import tool_call_grammar

__all__ = ["BadRequest", "Call", "Constraint", "check_model", "parse_chat", "parse_completion"]

MAX_CHOICES = 16  # answers one request may ask for: n times the prompts (each runs as its own generation)
MAX_STOPS = 4
# repetition_penalty's range: at least 0.01, so that a logit divided by it stays a float32 (a smaller one would make
# the seen tokens' logits infinite), at most 10 (a penalty past that leaves a seen token no chance anyway)
REPEAT_PENALTY = (0.01, 10.0)


@dataclass(frozen=True)
class Constraint:
    """What a request asks its answer to be held to (structured output), as it came: the request's `field` that
    asked (response_format, json_schema, grammar, tool_choice), the grammar's `kind`
    (strata.generation.constraints.KINDS) and its `source`. The server compiles it before the request waits."""

    field: str
    kind: str
    source: Any


@dataclass(frozen=True)
class Call:
    """What one request asks for, in the terms strata.generation.Session takes: `n` choices of each prompt, each
    choice its own generation (choice j of prompt i is answer i * n + j, as OpenAI numbers them)."""

    kind: str                                   # "chat" or "completion"
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: each text or token ids
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat
    tools: list[dict[str, Any]] | None = None
    n: int = 1
    max_tokens: int | None = None               # None: until EOS or the context
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None                 # alternatives per token, None: no logprobs
    sampling: dict[str, Any] = field(default_factory=dict)  # Session's sampling options (SAMPLING_OPTIONS)
    template_options: dict[str, Any] = field(default_factory=dict)
    constraint: Constraint | None = None        # structured output, as asked for
    grammar: Any = None                         # ... and compiled (strata.generation.constraints.Grammar)
    control_vectors: tuple[tuple[int, float], ...] | None = None  # (id, scale) of the server's; None: its own set

    @property
    def answers(self) -> int:
        """How many generations the request asks for: n per prompt (a chat has one prompt)."""
        return self.n * max(len(self.prompts), 1)

    def generate_options(self, answer: int = 0) -> dict[str, Any]:
        """The Session options of `answer`: a seed given goes up by one from one choice of a prompt to the next,
        so that the n choices differ and the request repeated gives them again."""
        options = {**self.sampling, "max_tokens": self.max_tokens, "logprobs": self.logprobs}
        if self.grammar is not None:
            options["grammar"] = self.grammar
        if answer % self.n and options.get("seed") is not None and options["seed"] >= 0:
            options["seed"] += answer % self.n
        return options


# Fields whose values here would change nothing, with the values accepted (a null, an empty or the default value;
# anything else asks for what the server does not do and is refused by name): OpenAI's (one service tier, one
# modality, no predicted output) and llama-server's samplers at their off values, which its clients send.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "service_tier": (None, "auto", "default"), "modalities": (None, ["text"]), "audio": (None,),
    "prediction": (None,), "functions": (None, []), "function_call": (None, "auto", "none"),
    "reasoning_effort": (None,), "verbosity": (None,), "web_search_options": (None,), "best_of": (None, 1),
    "suffix": (None, ""), "echo": (None, False), "typical_p": (None, 1, 1.0), "mirostat": (None, 0),
    "dry_multiplier": (None, 0, 0.0), "xtc_probability": (None, 0, 0.0), "dynatemp_range": (None, 0, 0.0),
    "top_n_sigma": (None, -1, -1.0), "id_slot": (None, -1), "timings_per_token": (None, False),
}
# Fields taken and ignored, each of its types: nothing is stored (store, metadata); prefix reuse is automatic
# (cache_prompt, prompt_cache_key); some identify the caller; the rest are llama-server's settings of samplers that
# are off here (its web UI sends them all), its sampler order (strata's is fixed: llama.cpp's default) and the
# repetition penalty's window (strata's counts the whole sequence).
NUMBER = (int, float)
IGNORED: dict[str, tuple[type, ...]] = {
    "store": (bool,), "metadata": (dict,), "cache_prompt": (bool,), "user": (str,), "prompt_cache_key": (str,),
    "safety_identifier": (str,), "samplers": (str, list), "dynatemp_exponent": NUMBER, "xtc_threshold": NUMBER,
    "dry_base": NUMBER, "dry_allowed_length": NUMBER, "dry_penalty_last_n": NUMBER, "repeat_last_n": NUMBER,
}
_TYPE_NAMES = {bool: "true or false", dict: "an object", str: "a string", list: "a list", int: "a number",
               float: "a number"}
LLAMA_SERVER_NEUTRAL = {"typical_p", "mirostat", "dry_multiplier", "xtc_probability", "dynatemp_range",
                        "top_n_sigma", "id_slot", "timings_per_token"}
COMMON = {"model", "stream", "stream_options", "max_tokens", "n_predict", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "repeat_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "seed",
          "stop", "n", "ignore_eos", "service_tier", "grammar", "json_schema", "control_vectors", *IGNORED,
          *LLAMA_SERVER_NEUTRAL}
CHAT = COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                 "parallel_tool_calls", "chat_template_kwargs", "response_format", "modalities", "audio",
                 "prediction", "functions", "function_call", "reasoning_effort", "verbosity", "web_search_options"}
COMPLETION = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
# the names the chat template is rendered with besides chat_template_kwargs (strata.chat.render_chat's own)
TEMPLATE_NAMES = {"template", "messages", "add_generation_prompt", "bos_token", "eos_token"}
# response_format's keys, by its type, and those of its json_schema object (OpenAI's; json_object's schema is
# llama-server's)
RESPONSE_FORMATS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}
ANY_OBJECT = {"type": "object"}


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"'{key}' must be a number, got {value!r:.60}", key, "invalid_type")
    if value < low or value > high or (low_open and value == low):
        interval = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise BadRequest(f"'{key}' must be in {interval}, got {value}", key, "invalid_value")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r:.60}", key, "invalid_type")
    if value < low or (high is not None and value > high):
        raise BadRequest(f"'{key}' must be in {low}..{high if high is not None else ''}, got {value}", key,
                         "invalid_value")
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if not isinstance(value, (bool, type(None))):
        raise BadRequest(f"'{key}' must be true or false", key, "invalid_type")
    return bool(value)


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) for s in stop):
        return stop
    raise BadRequest(f"'stop' must be a string or a list of up to {MAX_STOPS} strings", "stop", "invalid_type")


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", None, "invalid_type")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}", unknown[0], "unknown_parameter")
    _flag(body, "stream")
    for key in set(NEUTRAL) & set(body):
        if not any(type(body[key]) is type(value) and body[key] == value for value in NEUTRAL[key]):
            accepted = " or ".join(json.dumps(value) for value in NEUTRAL[key])
            raise BadRequest(f"'{key}' is not supported here (accepted: {accepted})", key, "unsupported_parameter")
    for key, kinds in IGNORED.items():
        if body.get(key) is not None and (not isinstance(body[key], kinds) or isinstance(body[key], bool)
                                          and bool not in kinds):
            names = " or ".join(dict.fromkeys(_TYPE_NAMES[kind] for kind in kinds))
            raise BadRequest(f"'{key}' must be {names}", key, "invalid_type")


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        "top_k": _integer(body, "top_k", 0) or 0,
        "min_p": _number(body, "min_p", 0.0, 0.0, 0.999999),
        "repeat_penalty": _repeat_penalty(body),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        "presence_penalty": _number(body, "presence_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        "logit_bias": _logit_bias(body),
        "seed": _integer(body, "seed", RANDOM_SEED),  # -1: a fresh random seed, as in the API and the CLI
        "stop": _stop(body),
        "ignore_eos": _flag(body, "ignore_eos"),
    }


def _repeat_penalty(body: Mapping[str, Any]) -> float:
    """repetition_penalty (vLLM's name) or repeat_penalty (llama-server's): one of them, or both alike."""
    given = {key: _number(body, key, 1.0, *REPEAT_PENALTY) for key in ("repetition_penalty", "repeat_penalty")
             if key in body}
    if len(set(given.values())) > 1:
        raise BadRequest("'repetition_penalty' and 'repeat_penalty' name one thing: give one value",
                         "repeat_penalty", "invalid_value")
    return next(iter(given.values()), 1.0)


def _logit_bias(body: Mapping[str, Any]) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[token id, bias], ...], each bias in [-100, 100]. Whether
    the ids are in the vocabulary, the session checks (and names the field)."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, (dict, list)):
        raise BadRequest("'logit_bias' must be an object of token ids to biases (or a list of [id, bias] pairs)",
                         "logit_bias", "invalid_type")
    out = {}
    for pair in bias.items() if isinstance(bias, dict) else bias:
        token, value = pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (None, None)
        if isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 12:
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise BadRequest(f"'logit_bias' keys are token ids (integers >= 0), got {pair!r:.60}", "logit_bias",
                             "invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= MAX_BIAS:
            raise BadRequest(f"'logit_bias' values are numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got "
                             f"{value!r:.60} for token {token}", "logit_bias", "invalid_value")
        out[token] = float(value)
    return out


def _choices(body: Mapping[str, Any], prompts: int = 1) -> int:
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    if n * prompts > MAX_CHOICES:
        raise BadRequest(f"'n' ({n}) times the prompts ({prompts}) asks for {n * prompts} answers; at most "
                         f"{MAX_CHOICES} a request", "n", "invalid_value")
    return n


def _max_tokens(body: Mapping[str, Any], keys: tuple[str, ...], default: int | None) -> int | None:
    """The first of `keys` given, else llama-server's n_predict, each >= 1 or -1 (llama-server's: until EOS or the
    context), else `default`."""
    for key in (*keys, "n_predict"):
        value = _integer(body, key, -1)
        if value == 0:
            raise BadRequest(f"'{key}' must be >= 1 (or -1: until EOS or the context)", key, "invalid_value")
        if value is not None:
            return None if value == -1 else value
    return default


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
    if isinstance(arguments, str):  # JSON in a string: read within the body's limits
        arguments = read_json(arguments or "{}", f"messages[{i}].tool_calls: the arguments' text",
                              f"messages[{i}]")
    return {**call, "function": {**function, "arguments": arguments}}


def parse_chat(body: Any) -> Call:
    _check_fields(body, CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages", "invalid_value")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("'tools' must be a list of tool objects", "tools", "invalid_type")
    choice = _tool_choice(body.get("tool_choice"), tools)
    constraint = _one_constraint([_response_format(body.get("response_format")), *_llama_constraints(body),
                                  None if choice is None else _tool_constraint(tools, choice, body)])
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type")
    if reserved := sorted(TEMPLATE_NAMES & set(kwargs)):
        raise BadRequest(f"'chat_template_kwargs' may not set {', '.join(reserved)}: the server renders the "
                         "template with its own", "chat_template_kwargs", "invalid_value")
    top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    _flag(body, "parallel_tool_calls")  # taken as it comes: the model calls as many tools as it writes
    options = dict(kwargs)
    if tools and body.get("tool_choice") != "none":
        options["tools"] = tools
    return Call("chat", messages=[_message(i, m) for i, m in enumerate(messages)], tools=options.get("tools"),
                n=_choices(body), max_tokens=_max_tokens(body, ("max_completion_tokens", "max_tokens"), None),
                stream=_flag(body, "stream"), include_usage=_include_usage(body),
                logprobs=(top or 0) if _flag(body, "logprobs") else None, sampling=_sampling(body),
                template_options=options, constraint=constraint,
                control_vectors=parse_control_vectors(body.get("control_vectors")))


def parse_completion(body: Any) -> Call:
    _check_fields(body, COMPLETION)
    prompts = _prompts(body.get("prompt"))
    return Call("completion", prompts=prompts, n=_choices(body, len(prompts)),
                max_tokens=_max_tokens(body, ("max_tokens",), 16),  # 16: OpenAI's default for completions
                stream=_flag(body, "stream"), include_usage=_include_usage(body),
                logprobs=_integer(body, "logprobs", 0, 5), sampling=_sampling(body),
                constraint=_one_constraint(_llama_constraints(body)),
                control_vectors=parse_control_vectors(body.get("control_vectors")))


# ------------------------------------------------------------------------------------------ structured output


def _response_format(value: Any) -> Constraint | None:
    """OpenAI's response_format: text (nothing), json_object (any object; llama-server's `schema` beside it, that
    schema), json_schema ({name, description, schema, strict}: the schema, enforced whether strict or not)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise BadRequest("'response_format' must be an object whose type is text, json_object or json_schema",
                         "response_format", "invalid_value")
    if unknown := sorted(set(value) - RESPONSE_FORMATS[kind]):
        raise BadRequest(f"'response_format' of type {kind} takes no {unknown[0]!r}", "response_format",
                         "unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        if schema is not None and not isinstance(schema, (dict, bool)):
            raise BadRequest("'response_format.schema' must be a JSON schema (an object)", "response_format",
                             "invalid_type")
        return Constraint("response_format", "json_schema", ANY_OBJECT if schema is None else schema)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest("'response_format' of type json_schema needs its 'json_schema' object (name, schema, "
                         "strict)", "response_format", "invalid_value")
    if unknown := sorted(set(spec) - JSON_SCHEMA_KEYS):
        raise BadRequest(f"'response_format.json_schema' takes no {unknown[0]!r} (it takes "
                         f"{', '.join(sorted(JSON_SCHEMA_KEYS))})", "response_format", "unknown_parameter")
    for key, kinds in (("name", str), ("description", str), ("strict", bool)):
        if spec.get(key) is not None and not isinstance(spec[key], kinds):
            raise BadRequest(f"'response_format.json_schema.{key}' must be {_TYPE_NAMES[kinds]}", "response_format",
                             "invalid_type")
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise BadRequest("'response_format.json_schema.schema' must be a JSON schema (an object)", "response_format",
                         "invalid_type")
    return Constraint("response_format", "json_schema", ANY_OBJECT if schema is None else schema)


def _llama_constraints(body: Mapping[str, Any]) -> list[Constraint | None]:
    """llama-server's fields: `grammar` (GBNF text) and `json_schema` (a JSON schema)."""
    out: list[Constraint | None] = []
    grammar = body.get("grammar")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise BadRequest("'grammar' must be a string (a GBNF grammar)", "grammar", "invalid_type")
        out.append(Constraint("grammar", "gbnf", grammar) if grammar else None)  # "": no grammar, as llama-server
    schema = body.get("json_schema")
    if schema is not None:
        if not isinstance(schema, (dict, bool)):
            raise BadRequest("'json_schema' must be a JSON schema (an object)", "json_schema", "invalid_type")
        out.append(Constraint("json_schema", "json_schema", schema))
    return out


def _one_constraint(given: list[Constraint | None]) -> Constraint | None:
    found = [c for c in given if c is not None]
    if len(found) > 1:
        raise BadRequest(f"'{found[0].field}' and '{found[1].field}' each constrain the answer: give one",
                         found[1].field, "invalid_value")
    return found[0] if found else None


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    """None where the model may answer as it likes (auto, none, not given); "" where it must call a tool
    (required); a function's name where it must call that one."""
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        name = ""
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        name = choice["function"]["name"]
    else:
        raise BadRequest("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}", "tool_choice", "invalid_value")
    if not tools:
        raise BadRequest("'tool_choice' asks for a tool call, but the request gives no 'tools'", "tool_choice",
                         "invalid_value")
    return name


def _tool_constraint(tools: list[dict[str, Any]], name: str, body: Mapping[str, Any]) -> Constraint:
    """The answer as the Qwen models write tool calls, each call's arguments held to its tool's parameters."""
    try:
        grammar = tool_call_grammar(tools, name or None, parallel=body.get("parallel_tool_calls") is not False)
    except ValueError as error:
        param = "tool_choice" if name and "no tool named" in str(error) else "tools"
        raise BadRequest(str(error), param, "invalid_value") from None
    return Constraint("tool_choice", "lark", grammar)


def _prompts(prompt: Any) -> list[str | list[int]]:
    """A completion's prompts: one text, one list of token ids, or a list of up to MAX_CHOICES of either."""
    def token_ids(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)

    if isinstance(prompt, str) or (token_ids(prompt) and prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or token_ids(p) for p in prompt):
        prompts = prompt
    else:
        raise BadRequest("'prompt' must be a string, a list of token ids, or a list of either", "prompt",
                         "invalid_value")
    if len(prompts) > MAX_CHOICES:
        raise BadRequest(f"'prompt' lists {len(prompts)} prompts; at most {MAX_CHOICES} a request", "prompt",
                         "invalid_value")
    if not all(prompts):
        raise BadRequest("'prompt' must not be empty (nor any prompt of a list)", "prompt", "invalid_value")
    return prompts


def check_model(model: Any) -> None:
    """A request may name any model: the one model served answers it, as llama-server answers any name (so a
    client's configured name keeps working); when given it must be a string."""
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model", "invalid_type")
