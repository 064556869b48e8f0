"""Chat templates a user gives instead of the model file's: a built-in by name, Jinja text, or a file of it
(`strata serve` and `strata chat`: --chat-template, --chat-template-file). Checked once, when given, by
rendering a conversation of one user message, so a template that does not parse or render is refused at start
and not at the first request."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from strata.chat import render_chat
from strata.errors import InvalidArgument, StrataError

# ChatML, the turn format of the Qwen templates, for vocabularies strata makes (synth, convert without a
# tokenizer) and by name; tools as the Qwen templates render them (offered in the system turn, called in
# <tool_call> tags, answered in <tool_response> tags of a user turn).
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
    " XML tags.<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and tools and loop.first %}"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for call in m['tool_calls'] or [] %}\n<tool_call>\n"
    "{\"name\": \"{{ call['function']['name'] }}\", \"arguments\": {{ call['function']['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

BUILT_IN = {"chatml": CHATML_TEMPLATE}
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file larger is refused (the largest models' are tens of kB)
JINJA_MARKS = ("{{", "{%")


def chosen_template(text: str | None = None, file: str | Path | None = None) -> str | None:
    """The template named by `text` (a built-in's name, or Jinja text) or held in `file`; None when neither is
    given. InvalidArgument, naming the option, for both at once, an unknown name, an unreadable file, or a
    template that does not render."""
    if text is not None and file is not None:
        raise InvalidArgument("give --chat-template or --chat-template-file, not both")
    if file is not None:
        option, template = "--chat-template-file", _read(Path(file))
    elif text is not None:
        option, template = "--chat-template", BUILT_IN.get(text, text)
        if template == text and not any(mark in text for mark in JINJA_MARKS):
            raise InvalidArgument(f"--chat-template {text!r} is neither a built-in ({', '.join(BUILT_IN)}) nor "
                                  "Jinja text (it has no {{ or {%)")
    else:
        return None
    try:
        render_chat(template, [{"role": "user", "content": "hello"}])
    except StrataError as error:
        raise InvalidArgument(f"{option}: {error}") from None
    return template


def _read(path: Path) -> str:
    template = read_user_text(path, "--chat-template-file", MAX_TEMPLATE_BYTES)
    if not template.strip():
        raise InvalidArgument(f"--chat-template-file {path} is empty")
    return template


def read_user_text(path: str | Path, option: str, limit: int) -> str:
    """The UTF-8 text of the regular file at `path`, given with the command line's `option`, of at most `limit`
    bytes, read without blocking: a FIFO (whose read waits for a writer), a device (/dev/zero never ends) or a
    directory is refused, as is a larger file, each an InvalidArgument naming the option."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, writer or not
    except OSError as error:
        raise InvalidArgument(f"{option} {path}: {error.strerror or error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument(f"{option} {path}: not a regular file (a FIFO, device or directory); give a "
                                  "file's path")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise InvalidArgument(f"{option} {path}: {error.strerror or error}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise InvalidArgument(f"{option} {path}: over {limit} bytes")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidArgument(f"{option} {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
