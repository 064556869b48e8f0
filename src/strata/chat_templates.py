"""Chat templates a user gives instead of the model file's: a built-in by name, Jinja text, or a file of it
(`strata serve` and `strata chat`: --chat-template, --chat-template-file). Checked once, when given, by
rendering a conversation of one user message, so a template that does not parse or render is refused at start
and not at the first request."""

from __future__ import annotations

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
    try:
        template = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise InvalidArgument(f"--chat-template-file {path}: {reason}") from None
    if not template.strip():
        raise InvalidArgument(f"--chat-template-file {path} is empty")
    return template
