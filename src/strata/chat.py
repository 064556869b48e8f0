"""Chat templates: render a model's (GGUF-stored) Jinja template over a list of messages.

The template comes from the model file, i.e. from whoever made it, so it runs in jinja2's
ImmutableSandboxedEnvironment, as transformers does: it can format strings and walk the messages, but not
reach Python internals or mutate what it is given. A template that tries is refused with FormatError.

What the messages (and the template's other values: tools, their descriptions) say is text, never control
tokens: `render_chat_segments` tells the template's own markers from the same text written in a message, so a
message cannot end its turn or forge another (`hi<|im_end|><|im_start|>system...` stays text).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from strata.errors import FormatError, InvalidArgument


NONCE_BYTES = 8
# a marker's text written in a value, while the template renders: Q, the call's nonce, M, the marker's index, E
SWAPPED = f"Q([0-9a-f]{{{2 * NONCE_BYTES}}})M([0-9]+)E"


class TemplateRaised(Exception):
    """The template itself called raise_exception(message)."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as error:
        raise FormatError(f"chat template does not parse: {error.message} (line {error.lineno})") from None


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgument("messages must be a list of {'role': ..., 'content': ...} mappings")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise InvalidArgument(f"message {i} must be a mapping with a 'role' key, got {message!r:.80}")
        if not isinstance(message["role"], str):
            raise InvalidArgument(f"message {i}'s role must be a string, got {message['role']!r:.80}")
        if not isinstance(message.get("content"), (str, list, type(None))):
            raise InvalidArgument(f"message {i}'s content must be a string, a list of parts or None, got "
                                  f"{type(message['content']).__name__}")
        checked.append(dict(message))
    return checked


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """The prompt text for `messages`. Extra keyword arguments (tools, enable_thinking, ...) reach the template."""
    return _render(template, _check_messages(messages), add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, **extra)


def render_chat_segments(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    markers: Collection[str],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> list[tuple[str, bool]]:
    """The prompt for `messages` as (text, is_marker) segments, in order, joining to `render_chat`'s text.

    `markers` are the texts of the vocabulary's control tokens. A marker segment is one the template wrote
    itself; everything else, including a marker's text written in a message or in a value of `extra`, is in the
    plain segments. Each value the caller gave reaches the template with its markers swapped for a token of
    this call (a random nonce, so no message can spell it), which the rendered text turns back into the marker's
    text, now known to be the caller's."""
    markers = sorted({m for m in markers if m}, key=len, reverse=True)  # longest first: leftmost-longest match
    if not markers:
        return [(render_chat(template, messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                             eos_token=eos_token, **extra), False)]
    written = "|".join(map(re.escape, markers))
    nonce = secrets.token_hex(NONCE_BYTES)
    index = {marker: i for i, marker in enumerate(markers)}

    def swap(text: str) -> str:
        return re.sub(written, lambda m: f"Q{nonce}M{index[m.group()]}E", text)

    text = _render(template, _swapped(_check_messages(messages), swap), add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, **_swapped(extra, swap))
    segments: list[tuple[str, bool]] = []
    plain: list[str] = []
    at = 0
    # the swapped values' pattern matches any nonce, so that the pattern is the same on every call: one with this
    # call's nonce in it was compiled anew each time and filled re's cache (512 patterns) with patterns used once,
    # which outlived their request and kept the allocator's arenas they were made in from being given back
    for match in re.finditer(f"{SWAPPED}|{written}", text):
        plain.append(text[at:match.start()])
        at = match.end()
        if match.group(1) is not None:  # the same text with another nonce is plain text
            plain.append(markers[int(match.group(2))] if match.group(1) == nonce else match.group())
        else:
            segments += [("".join(plain), False), (match.group(), True)]
            plain = []
    plain.append(text[at:])
    segments.append(("".join(plain), False))
    if any(nonce in piece for piece, _ in segments):
        raise FormatError("chat template changed message text that holds a control token's text beyond recognition; "
                          "it cannot be kept as text")
    return [(piece, marker) for piece, marker in segments if piece]


def _swapped(value: Any, swap: Callable[[str], str]) -> Any:
    """`value` with `swap` applied to every string in it, keys too (a function of the module's: one nested in
    render_chat_segments that called itself was a reference cycle, left to the cyclic collector on every call)."""
    if isinstance(value, str):
        return swap(value)
    if isinstance(value, Mapping):
        return {_swapped(k, swap): _swapped(v, swap) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_swapped(v, swap) for v in value]
    return value


def _render(template: str, messages: list[dict[str, Any]], **values: Any) -> str:
    if not template:
        raise FormatError("the model file carries no chat template (tokenizer.chat_template)")
    compiled = _compile(template)
    try:
        return compiled.render(messages=messages, **values)
    except SecurityError as error:
        raise FormatError(f"chat template tried to leave its sandbox and was stopped: {error}") from None
    except TemplateRaised as error:
        raise InvalidArgument(f"chat template refused the messages: {error}") from None
    except jinja2.TemplateError as error:
        raise FormatError(f"chat template failed to render: {error}") from None
    except (TypeError, ValueError, KeyError, IndexError) as error:  # values the template cannot take, e.g. str + None
        raise InvalidArgument(f"chat template could not render the messages: {type(error).__name__}: {error}") from None
