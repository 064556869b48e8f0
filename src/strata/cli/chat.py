"""`strata chat`: an interactive conversation over a Session. /reset forgets the conversation, /exit (or
end of input) leaves; Ctrl-C while the model writes stops its answer at a token boundary."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from strata.cli import session as session_options

if TYPE_CHECKING:
    from strata.generation import Session


def register(commands) -> None:
    sub = commands.add_parser("chat", help="an interactive conversation (/reset, /exit)")
    session_options.add_arguments(sub)
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    with session_options.opened(args) as session:
        converse(session, sys.stdin, sys.stdout, max_tokens=args.max_tokens, **session_options.sampling(args))
    return 0


def converse(session: Session, lines: Iterable[str], out: TextIO, prompt: str = "> ", **generate: Any) -> None:
    history: list[dict[str, str]] = []
    out.write(prompt)
    out.flush()
    for line in lines:
        text = line.rstrip("\n")
        if text == "/exit":
            break
        if text == "/reset":
            history.clear()
            out.write("(conversation cleared)\n")
        elif text.strip():
            history.append({"role": "user", "content": text})
            answer = []
            for piece in session.chat(history, **generate):
                answer.append(piece.text)
                out.write(piece.text)
                out.flush()
            out.write("\n")
            history.append({"role": "assistant", "content": "".join(answer)})
        out.write(prompt)
        out.flush()
    out.write("\n")
