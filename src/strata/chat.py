"""Chat templates: render a model's (GGUF-stored) Jinja template over a list of messages.

The template comes from the model file, i.e. from whoever made it, so it runs in jinja2's
ImmutableSandboxedEnvironment, as transformers does: it can format strings and walk the messages, but not
reach Python internals or mutate what it is given. A template that tries is refused with FormatError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from strata.errors import FormatError, InvalidArgument


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
    if not template:
        raise FormatError("the model file carries no chat template (tokenizer.chat_template)")
    compiled = _compile(template)
    try:
        return compiled.render(
            messages=_check_messages(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except SecurityError as error:
        raise FormatError(f"chat template tried to leave its sandbox and was stopped: {error}") from None
    except TemplateRaised as error:
        raise InvalidArgument(f"chat template refused the messages: {error}") from None
    except jinja2.TemplateError as error:
        raise FormatError(f"chat template failed to render: {error}") from None
