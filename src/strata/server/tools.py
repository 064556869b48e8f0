"""Tool calls in the Qwen models' output (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as their
chat templates teach them) as OpenAI `tool_calls`; while streaming, the text of a call is held back."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

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
