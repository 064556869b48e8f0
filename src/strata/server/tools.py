"""Tool calls in the Qwen models' output (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as their
chat templates teach them) as OpenAI `tool_calls`; while streaming, the text of a call is held back. Where a request
must call a tool (tool_choice required, or a function named), `tool_call_grammar` is the answer's grammar: calls in
that form, each call's arguments held to its tool's parameters schema."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from strata.generation.constraints import JSON_LAYOUT
from strata.generation.text import pending_stop

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(the text outside the calls, the OpenAI tool_calls). A call whose body is not a JSON object with a name
    stays in the text: the model wrote something, just not a call."""
    calls = []
    kept = text
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": body["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
        kept = kept.replace(match.group(0), "", 1)
    return (kept.strip() if calls else text), calls


class ToolCallStream:
    """Hands out streamed text up to where a tool call starts (or may start); `finish` returns the rest of the
    content and the calls."""

    def __init__(self) -> None:
        self.text = ""
        self.shown = 0

    def push(self, new: str) -> str:
        self.text += new
        start = self.text.find(OPEN, self.shown)
        end = start if start >= 0 else len(self.text) - pending_stop(self.text, (OPEN,))
        if end <= self.shown:
            return ""
        out, self.shown = self.text[self.shown:end], end
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        content, calls = split_tool_calls(self.text)
        if calls:
            return "", calls  # the content before the first call was already shown
        return self.text[self.shown:], []


# A function without parameters takes none: its arguments are the empty object (OpenAI's reading).
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def _call_schema(tool: Any, index: int) -> tuple[str, dict[str, Any]]:
    """A tool's name and the JSON schema of a call of it, {"name": that name, "arguments": its parameters} (the
    parameters' definitions, `$defs` or `definitions`, at the call schema's root, where their references point)."""
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                         "\"parameters\": {...}}}")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    if not isinstance(parameters, (dict, bool)):
        raise ValueError(f"tools[{index}].function.parameters must be a JSON schema (an object)")
    hoisted = {}
    if isinstance(parameters, dict):
        hoisted = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}
        parameters = {key: value for key, value in parameters.items() if key not in hoisted}
    return function["name"], {**hoisted, "type": "object", "properties": {"name": {"const": function["name"]},
                                                                          "arguments": parameters},
                              "required": ["name", "arguments"], "additionalProperties": False,
                              "x-guidance": dict(JSON_LAYOUT)}


def tool_call_grammar(tools: list[Any], name: str | None, parallel: bool = True) -> str:
    """The grammar (llguidance's Lark) of an answer that calls tools as the Qwen models write calls: one call of the
    function `name`, or (None: tool_choice required) one or more calls (one where not `parallel`) of any of `tools`.
    ValueError names a tool that is no function, or a name no tool has."""
    calls = dict(_call_schema(tool, i) for i, tool in enumerate(tools))
    if name is not None:
        if name not in calls:
            raise ValueError(f"tool_choice names the function {name!r:.80}, but there is no tool named so "
                             f"(the tools: {', '.join(map(repr, calls))[:200]})")
        calls = {name: calls[name]}
    more = ' ("\\n" call)*' if name is None and parallel else ""
    rules = [f"function{i}: %json {json.dumps(schema, ensure_ascii=True)}" for i, schema in enumerate(calls.values())]
    choice = " | ".join(f"function{i}" for i in range(len(rules)))
    return "\n".join([
        "%llguidance {}", "", f"start: call{more}",
        f"call: {json.dumps(OPEN + chr(10))} ({choice}) {json.dumps(chr(10) + CLOSE)}", *rules, ""])
