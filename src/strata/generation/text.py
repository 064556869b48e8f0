"""Text of a token stream as it grows: stop strings cut (and held back while they may still form), trailing
partial UTF-8 characters held back, each token's share of the text handed out once."""

from __future__ import annotations

from collections.abc import Sequence


def pending_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `stops`."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-n:]):
                longest = n
                break
    return longest


class TextStream:
    """Decodes the generated ids after each new token; `push` returns the new text ready to show and whether
    a stop string ended it."""

    def __init__(self, decode, stops: Sequence[str]):
        self.decode, self.stops = decode, tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        text = self.decode(self.ids)
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
        ready = len(text) if cut >= 0 else len(text) - pending_stop(text, self.stops)
        while ready > len(self.emitted) and text[ready - 1] == "\ufffd":
            ready -= 1
        new = text[len(self.emitted):ready] if ready > len(self.emitted) else ""
        self.emitted = text[:max(ready, len(self.emitted))]
        return new, cut >= 0
