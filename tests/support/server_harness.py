"""What the server tests share (besides strata.server.background.serving, the live server on 127.0.0.1): the
official client, and an engine whose answers are a function of the conversation (so a test knows
what every client must get back)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import openai

from strata.generation import Session
from strata.sampling import SamplingParams


def get(url: str, path: str) -> str:
    """The text of GET `path` on the server whose API is at `url` (.../v1)."""
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + path, timeout=10) as response:
        return response.read().decode()


def wait_idle(server, seconds: float = 10.0) -> None:
    """Until `server` has no request generating or waiting (a failure after `seconds`)."""
    deadline = time.monotonic() + seconds
    while server.pool.busy or server.pool.waiting:
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.01)


def client(url: str, key: str = "unused", **options) -> openai.OpenAI:
    """The official client, with no retries: a test sees each answer as the server gave it."""
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, **options)


class ScriptedEngine:
    """An engine that answers `answer(seen)` token by token (seen: every token of the sequence when the
    assistant's turn began, as the session hands it), then `eos`; `delay` seconds per feed stand for compute."""

    def __init__(self, answer: Callable[[list[int]], list[int]], turn_start: Sequence[int], eos: int,
                 context: int = 1024, delay: float = 0.0):
        self.answer, self.turn_start, self.eos = answer, list(turn_start), eos
        self.context, self.delay = context, delay
        self.position = 0
        self.fed: list[int] = []

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        time.sleep(self.delay)
        self.fed += ids
        self.position += len(ids)
        seen = list(seen)
        start = self._turn(seen)
        answer = self.answer(seen[:start])
        done = len(seen) - start
        return answer[done] if done < len(answer) else self.eos

    def reset(self) -> None:
        self.position = 0
        self.fed = []

    def _turn(self, seen: list[int]) -> int:
        """Where the last assistant turn's text starts in `seen`."""
        n = len(self.turn_start)
        for i in range(len(seen) - n, -1, -1):
            if seen[i:i + n] == self.turn_start:
                return i + n
        raise AssertionError("the scripted engine saw no assistant turn")


def turn_start(tok) -> list[int]:
    """The ids that open the assistant's turn in a ChatML prompt."""
    return tok.encode("<|im_start|>assistant\n", special=True)


def user_text(tok, seen: list[int]) -> str:
    """The last user message's text in a rendered conversation."""
    text = tok.decode(seen)
    last = text.rindex("<|im_start|>user\n") + len("<|im_start|>user\n")
    return text[last:text.index("<|im_end|>", last)]


def echo_session(tok, context: int, delay: float = 0.0) -> Session:
    """A Session that answers each chat with its last user message, word for word."""
    engine = ScriptedEngine(lambda seen: tok.encode(user_text(tok, seen)), turn_start(tok), tok.eos_ids[0],
                            context=context, delay=delay)
    return Session(engine, tok)
