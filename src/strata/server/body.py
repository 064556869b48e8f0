"""JSON from a client read within stated limits, before any work is done on it: UTF-8, JSON as RFC 8259 has it
(no NaN or Infinity), at most MAX_CONTAINERS arrays and objects (counted before the parse), nested at most
MAX_DEPTH deep, integers of at most MAX_DIGITS digits, numbers finite, every string (keys too) whole Unicode (no
lone surrogate, which a `\\ud800` escape could smuggle in and no encoder downstream could write). Anything else is
a BadRequest saying which limit, never an exception of the parser. The request body is read so, and so is JSON
inside it (a tool call's arguments)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

from strata.server.errors import BadRequest

MAX_DEPTH = 64  # arrays and objects inside each other
# Arrays and objects in one text. Each costs 60 to 250 bytes as a Python object, where it takes 2 or 3 in the
# text: a body of 8 MiB of `[],` parses into 2.8 million lists, and bodies of 100,000 objects (messages, a schema)
# left the allocator's arenas holding tens of MiB after they were refused.
MAX_CONTAINERS = 1 << 16
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes and all
MAX_DIGITS = 20  # an integer's digits: every integer field fits (int64 seeds, token ids) with room
MAX_PATH = 200  # characters of where a refused string is, as said (keys are the client's, of any length)
_SURROGATE = re.compile("[\ud800-\udfff]")


def read_json(raw: bytes | str, what: str = "the request body", param: str | None = None) -> Any:
    """The JSON value of `raw` within the module's limits; a BadRequest names `what` was read and the limit it
    broke (code invalid_json for the body, invalid_value for the field `param`), and its param is `param` or, for
    a string that is not whole Unicode, where in the body it is (messages[0].content)."""
    def refused(message: str, where: str | None = None) -> BadRequest:
        return BadRequest(f"{what} {message}", param or where, "invalid_json" if param is None else "invalid_value")

    try:
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as error:
        raise refused(f"is not valid UTF-8 ({error})") from None
    if (containers := _containers(text)) > MAX_CONTAINERS:
        raise refused(f"holds {containers} arrays and objects; at most {MAX_CONTAINERS} are read")
    try:
        value = json.loads(text, parse_int=partial(_integer, refused), parse_float=partial(_number, refused),
                           parse_constant=partial(_constant, refused))
    except RecursionError:
        raise refused(f"nests arrays and objects over {MAX_DEPTH} deep") from None
    except json.JSONDecodeError as error:
        raise refused(f"is not valid JSON ({error})") from None
    _check_tree(value, refused)
    return value


def _containers(text: str) -> int:
    """The arrays and objects of JSON `text`: its brackets, those inside strings left out only where counting
    them too passes the limit (finding every string takes tens of ms a MiB, counting brackets a few)."""
    rough = text.count("[") + text.count("{")
    if rough <= MAX_CONTAINERS:
        return rough
    bare = _STRING.sub("", text)
    return bare.count("[") + bare.count("{")


def _integer(refused, text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise refused(f"holds an integer of {digits} digits; at most {MAX_DIGITS} are read")
    return int(text)


def _number(refused, text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise refused(f"holds the number {text[:40]}, which is not finite as a double")
    return value


def _constant(refused, name: str) -> None:
    raise refused(f"holds {name}, which is not JSON")


def _check_tree(value: Any, refused) -> None:
    """Depth and strings, walked without recursion (so the walk has no limit of its own)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, value, refused)
        elif isinstance(item, (list, dict)):
            if depth > MAX_DEPTH:
                raise refused(f"nests arrays and objects over {MAX_DEPTH} deep")
            if isinstance(item, dict):
                for key in item:
                    _check_text(key, value, refused)
                item = item.values()
            stack.extend((inner, depth + 1) for inner in item if isinstance(inner, (str, list, dict)))


def _check_text(text: str, value: Any, refused) -> None:
    if (found := _SURROGATE.search(text)) is not None:
        path, key = next((path, key) for path, key, string in _strings(value) if _SURROGATE.search(string))
        where = f"{'a key of ' if key else ''}{path or 'the body'}"
        raise refused(f"holds a lone UTF-16 surrogate (\\u{ord(found.group()):04x}) in {where}: strings must be "
                      "whole Unicode characters", path or None)


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, bool, str]]:
    """Every string in `value`, keys too, in order: (where it is, as OpenAI names a field: messages[0].content, a
    key by its object's; whether it is a key; it). Walked only where one is refused, within MAX_DEPTH by then."""
    if isinstance(value, str):
        yield path, False, value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield path, True, key
            yield from _strings(inner, f"{path}.{key}"[:MAX_PATH] if path else key[:MAX_PATH])
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _strings(inner, f"{path}[{index}]")
