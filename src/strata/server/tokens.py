"""llama-server's /tokenize and /detokenize: text to the model's token ids (each with its piece, on request) and
back, with the tokenizer the prompts go through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strata.errors import FormatError
from strata.server.errors import BadRequest


def _object(body: Any, fields: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", None, "invalid_type")
    if unknown := sorted(set(body) - fields):
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}", unknown[0], "unknown_parameter")
    for key in fields & set(body) - {"content", "tokens"}:
        if not isinstance(body[key], bool):
            raise BadRequest(f"'{key}' must be true or false", key, "invalid_type")
    return body


def tokenize(codec: Any, token_bytes: Callable[[int], bytes], body: Any) -> dict[str, Any]:
    """{"tokens": ids} of body["content"], or with `with_pieces` [{"id", "piece"}] (the piece: the token's text,
    or its bytes where they are not whole UTF-8, as llama-server gives it). `parse_special` reads control tokens
    written in the text (default false: as the completions route reads a prompt); `add_special` is taken, and
    adds nothing (the models strata runs begin with no BOS)."""
    body = _object(body, {"content", "add_special", "parse_special", "with_pieces"})
    content = body.get("content")
    if not isinstance(content, str):
        raise BadRequest("'content' must be a string", "content", "invalid_type")
    ids = codec.encode(content, special=True) if body.get("parse_special") else codec.encode(content)
    if not body.get("with_pieces"):
        return {"tokens": ids}
    return {"tokens": [{"id": token, "piece": _piece(token_bytes(token))} for token in ids]}


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def detokenize(codec: Any, body: Any) -> dict[str, Any]:
    """{"content": the text of body["tokens"]}; an id outside the vocabulary is a BadRequest naming it."""
    tokens = _object(body, {"tokens"}).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("'tokens' must be a list of token ids", "tokens", "invalid_type")
    try:
        return {"content": codec.decode(tokens)}
    except FormatError as error:
        raise BadRequest(str(error), "tokens", "invalid_value") from None
