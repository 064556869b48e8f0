"""`strata chat`: an interactive conversation over a Session. /reset forgets the conversation, /exit (or
end of input) leaves; Ctrl-C while the model writes stops its answer at a token boundary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

from strata.generation import Session


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
