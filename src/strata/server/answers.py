"""What the server sends back, in OpenAI's shapes: a whole answer of every choice, a stream's chunks, logprobs
with each token's own bytes, usage. Pure functions of the call, the pieces and the counts."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from strata.generation import Piece, Stats
from strata.server.requests import Call
from strata.server.tools import split_tool_calls

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "interrupted": "stop",
          "cancelled": "stop", "error": "stop"}


class Answers:
    """The shapes of the answers of the model called `model_name`; `token_bytes(id)` is a token's own bytes."""

    def __init__(self, model_name: str, token_bytes: Callable[[int], bytes]):
        self.model_name, self.token_bytes = model_name, token_bytes

    def head(self, call: Call) -> dict[str, Any]:
        """What every chunk of an answer (or the whole answer) starts with: one id, one time of creation."""
        kind = "chat.completion" if call.kind == "chat" else "text_completion"
        ident = ("chatcmpl-" if call.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        return {"id": ident, "object": kind + (".chunk" if call.stream and call.kind == "chat" else ""),
                "created": int(time.time()), "model": self.model_name}

    def whole(self, call: Call, head: dict[str, Any], pieces: Sequence[Sequence[Piece]],
              answers: Sequence[Stats | None], total: Stats) -> dict[str, Any]:
        """The answer of a request that does not stream: `pieces[i]` and `answers[i]` are choice i's (None: it
        never ran, its client gone first, and it is left out)."""
        choices = []
        for index, (got, stats) in enumerate(zip(pieces, answers)):
            if stats is None:
                continue
            text = "".join(p.text for p in got)
            finish = FINISH[stats.finish_reason]
            logprobs = self.logprobs(call, got)
            if call.kind == "chat":
                content, calls = split_tool_calls(text) if call.tools else (text, [])
                message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
                if calls:
                    message["tool_calls"], finish = calls, "tool_calls"
                choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            else:
                choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
        return {**head, "choices": choices, "usage": usage(total)}

    def event(self, head: dict[str, Any], call: Call, index: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None) -> str:
        """One server-sent event of choice `index`: `delta` (chat: its fields; completions: {"text": ...})."""
        if call.kind == "chat":
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta.get("text", ""), "logprobs": logprobs, "finish_reason": finish}
        return data({**head, "choices": [choice]})

    @staticmethod
    def delta(call: Call, text: str) -> dict[str, Any]:
        return {"content": text} if call.kind == "chat" else {"text": text}

    def logprobs(self, call: Call, pieces: Sequence[Piece]) -> Any:
        if call.logprobs is None:
            return None
        raw = {t: self.token_bytes(t) for p in pieces for t in (p.token, *(t for t, _ in p.top_logprobs))}
        text = {t: token_text(b) for t, b in raw.items()}
        if call.kind == "chat":
            def entry(token: int, logprob: float) -> dict[str, Any]:
                return {"token": text[token], "logprob": logprob, "bytes": list(raw[token])}
            return {"content": [{**entry(p.token, p.logprob),
                                 "top_logprobs": [entry(t, lp) for t, lp in p.top_logprobs]} for p in pieces]}
        return {"tokens": [text[p.token] for p in pieces], "token_logprobs": [p.logprob for p in pieces],
                "top_logprobs": [{text[t]: lp for t, lp in p.top_logprobs} for p in pieces]}


def usage(stats: Stats) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def data(payload: dict[str, Any]) -> str:
    """`payload` as one server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def token_text(raw: bytes) -> str:
    """A token's text in logprobs: its UTF-8, or where its bytes are not whole characters OpenAI's spelling of
    them (bytes:\\xe2\\x80), so that two tokens never read alike."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
