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
    a stop string ended it.

    With `byte_level` (the codec's decode is the UTF-8 decoding, invalid bytes replaced, of its ids' bytes laid end
    to end, as a byte-level BPE tokenizer's is), a text that ends in a whole character is final whatever ids follow,
    so only the ids after the last such point are decoded again at each token: the same text at a cost that does not
    grow with the answer (decoding it all again cost about 0.14 ms a token at 1,000 tokens, on the path between a
    batch's steps)."""

    def __init__(self, decode, stops: Sequence[str], byte_level: bool = False):
        self.decode, self.stops = decode, tuple(s for s in stops if s)
        self.byte_level = byte_level
        self.ids: list[int] = []
        self.emitted = ""
        self._final, self._final_ids = "", 0  # byte_level: the text of ids[:_final_ids], ending in a whole character

    def _text(self) -> str:
        """The text of every id so far."""
        if not self.byte_level:
            return self.decode(self.ids)
        tail = self.decode(self.ids[self._final_ids:])
        if tail and not tail.endswith("\ufffd"):  # its last character whole: no later byte changes it
            self._final, self._final_ids = self._final + tail, len(self.ids)
            return self._final
        return self._final + tail

    def push(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        text = self._text()
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
        ready = len(text) if cut >= 0 else len(text) - pending_stop(text, self.stops)
        while ready > len(self.emitted) and text[ready - 1] == "\ufffd":
            ready -= 1
        new = text[len(self.emitted):ready] if ready > len(self.emitted) else ""
        self.emitted = text[:max(ready, len(self.emitted))]
        return new, cut >= 0
