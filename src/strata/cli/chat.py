"""`strata chat`: an interactive conversation over a Session. /reset forgets the conversation, /exit (or end of
input, Ctrl-D) leaves; Ctrl-C while the model writes stops its answer at a token boundary. Each turn feeds only
what the session has not seen; when the conversation outgrows the context, the oldest turns are dropped (the
system prompt stays) and the user is told."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from strata.cli import chat_template
from strata.cli import session as session_options
from strata.cli.help import ShowDefaults

if TYPE_CHECKING:
    from strata.generation import Session

HELP_LINE = "(/exit or Ctrl-D leaves, /reset starts over, Ctrl-C stops an answer)"


def register(commands) -> None:
    sub = commands.add_parser("chat", help="an interactive conversation (/reset, /exit)",
                              formatter_class=ShowDefaults)
    session_options.add_arguments(sub)
    sub.add_argument("--system", default=None, help="a system prompt, kept when old turns are dropped")
    sub.add_argument("--think", dest="enable_thinking", action=argparse.BooleanOptionalAction, default=None,
                     help="the chat template's enable_thinking (default: the template's own)")
    sub.add_argument("--template-option", action="append", default=[], metavar="KEY=JSON",
                     help="another value for the chat template, e.g. tools='[...]' (repeatable)")
    chat_template.add_arguments(sub)
    sub.set_defaults(handler=handle)


def template_options(args: argparse.Namespace) -> dict[str, Any]:
    from strata.errors import InvalidArgument

    options: dict[str, Any] = {}
    for item in args.template_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--template-option {item!r}: expected KEY=JSON")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value  # a bare word is a string
    if args.enable_thinking is not None:
        options["enable_thinking"] = args.enable_thinking
    return options


def terminal_lines(prompt: str) -> Iterator[str]:
    """Lines typed at a terminal, with line editing and history (readline); ends at Ctrl-D."""
    try:
        import readline  # noqa: F401  (importing it gives input() editing and history)
    except ImportError:
        pass
    while True:
        try:
            yield input(prompt) + "\n"
        except EOFError:
            return


def handle(args: argparse.Namespace) -> int:
    from strata.errors import StrataError

    template = chat_template.chosen(args)
    with session_options.opened(args) as session:
        if not chat_template.install(template, [session]):
            raise StrataError(f"{args.model} carries no chat template; give one with --chat-template (a built-in "
                              "such as chatml, or Jinja text) or --chat-template-file")
        interactive = sys.stdin.isatty()
        lines = terminal_lines("> ") if interactive else sys.stdin
        converse(session, lines, sys.stdout, prompt="" if interactive else "> ", system=args.system,
                 template_options=template_options(args), **session_options.sampling(args))
    return 0


def fit(session: Session, history: list[dict[str, str]], room: int, template_options: dict[str, Any]) -> int:
    """Drop the oldest turns (never a system message) until the conversation and `room` tokens for the answer
    fit the session's context; returns how many messages were dropped, -1 if the last message alone does not."""
    def tokens() -> int:
        return len(session.chat_ids(history, template_options))

    dropped = 0
    while tokens() + room > session.engine.context:
        first = next((i for i, m in enumerate(history) if m["role"] != "system"), None)
        if first is None or first == len(history) - 1:
            return -1
        del history[first]
        dropped += 1
    return dropped


def converse(session: Session, lines: Iterable[str], out: TextIO, prompt: str = "> ", *, system: str | None = None,
             template_options: dict[str, Any] | None = None, **generate: Any) -> None:
    options = dict(template_options or {})
    start = [{"role": "system", "content": system}] if system else []
    history = list(start)
    out.write(HELP_LINE + "\n" + prompt)
    out.flush()
    for line in lines:
        text = line.rstrip("\n")
        if text == "/exit":
            break
        if text == "/reset":
            history = list(start)
            out.write("(conversation cleared)\n")
        elif text.strip():
            history.append({"role": "user", "content": text})
            dropped = fit(session, history, min(generate.get("max_tokens") or 1, 256), options)
            if dropped < 0:
                history.pop()
                out.write(f"(this message does not fit the session's context of {session.engine.context} tokens: "
                          "/reset, or start strata chat with a larger --context)\n")
            else:
                if dropped:
                    out.write(f"(the context is full: the oldest {dropped} message(s) were dropped)\n")
                answer = []
                try:
                    for piece in session.chat(history, template_options=options, **generate):
                        answer.append(piece.text)
                        out.write(piece.text)
                        out.flush()
                except KeyboardInterrupt:  # Ctrl-C ends the answer, not the conversation
                    pass
                out.write("\n")
                history.append({"role": "assistant", "content": "".join(answer)})
        out.write(prompt)
        out.flush()
    out.write("\n")
