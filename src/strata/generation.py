"""Generation over any decode engine: streamed text and tokens, stop conditions, Ctrl-C at a token boundary.

An engine appends token ids to its sequence and returns the next token, sampled by its own rules from a
uniform draw u (strata.sampling); the GPU session samples on the device and returns only the id, the
reference engine samples its numpy logits. Everything above that line lives here, once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from strata.chat import render_chat
from strata.errors import FormatError, InvalidArgument, StrataError
from strata.sampling import SamplingParams


class Engine(Protocol):
    context: int  # the most tokens the sequence may hold
    position: int  # tokens in the sequence so far

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """Append `ids` to the sequence; return the next token for the draw `u`."""
        ...

    def reset(self) -> None: ...


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    @property
    def eos_ids(self) -> list[int]: ...
    # A model's tokenizer also carries `chat_template` (str | None) and `tokens` (the vocabulary).


@dataclass(frozen=True)
class Piece:
    """One generated token and the text it completed (may be empty while a character or stop is pending)."""

    token: int
    text: str


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str = ""  # "eos", "stop", "length", "context", "interrupted"

    @property
    def decode_tokens_per_second(self) -> float:
        return (self.generated_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class _Interrupt:
    """SIGINT during a generate only raises a flag; the loop stops at the next token boundary."""

    requested: bool = False
    previous: object = field(default=None)

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _pending_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `stops`."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-n:]):
                longest = n
                break
    return longest


class Session:
    """A sequence on an engine: `generate` streams; the sequence carries over between calls until `reset`.

    The last token a generate produced (or its EOS) is fed at the start of the next call, so the engine's
    sequence always equals the text so far. One generate at a time: a second raises StrataError.
    """

    def __init__(self, engine: Engine, codec: TextCodec):
        self.engine, self.codec = engine, codec
        self.stats = Stats()
        self._busy = threading.Lock()
        self._history: list[int] = []  # every token fed to the engine (the repetition penalty's "seen")
        self._pending: list[int] = []  # produced but not yet fed

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise StrataError("this session is already generating; one generate at a time per session")
        try:
            yield
        finally:
            self._busy.release()

    @property
    def graphs(self) -> Any:
        """The engine's Graphs (mode, captured, per-stage timing; strata.runtime.engine.Graphs), or None for an
        engine without CUDA graphs (the reference)."""
        return getattr(self.engine, "graphs", None)

    def close(self) -> None:
        """Free the engine's resources (a GPU session's VRAM); the session cannot generate afterwards."""
        with self._exclusive():
            close = getattr(self.engine, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the sequence: the next generate starts from an empty context."""
        with self._exclusive():
            self.engine.reset()
            self._history.clear()
            self._pending.clear()
            self.stats = Stats()

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 256, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 seed: int | None = None, stop: Sequence[str] = ()) -> Iterator[Piece]:
        """Stream the continuation of `prompt` (text, or token ids) as Pieces; `stats` says why it ended."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty)
        ids = self.codec.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise InvalidArgument("the prompt is empty")
        if max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be >= 1, got {max_tokens}")
        left = self.engine.context - self.engine.position - len(self._pending)
        if len(ids) >= left:
            raise InvalidArgument(f"the prompt needs {len(ids)} tokens, {max(left, 0)} are left of the session's "
                                  f"context of {self.engine.context}; reset() the session or make a larger one")
        return self._stream(self._pending + ids, len(ids), max_tokens, params, np.random.default_rng(seed),
                            tuple(s for s in stop if s))

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, **kwargs: Any) -> Iterator[Piece]:
        """Stream the assistant's answer to `messages` rendered with the model's chat template. The session
        starts over (reset) and reads the whole conversation, so callers pass the full history each turn."""
        template = getattr(self.codec, "chat_template", None)
        if not template:
            raise FormatError("the model file carries no chat template (tokenizer.chat_template)")
        text = render_chat(template, messages, add_generation_prompt=True, bos_token=self._special("bos"),
                           eos_token=self._special("eos"))
        self.reset()
        return self.generate(text, max_tokens, **kwargs)

    def _special(self, name: str) -> str:
        ids = getattr(self.codec, "special_ids", {}).get(name) or []
        tokens = getattr(self.codec, "tokens", None)
        return tokens[ids[0]] if ids and tokens is not None else ""

    def _feed(self, ids: list[int], params: SamplingParams, u: float) -> int:
        token = self.engine.feed(ids, params, u, self._history + ids)
        self._history += ids
        return token

    def _stream(self, ids: list[int], n_prompt: int, max_tokens: int, params: SamplingParams,
                rng: np.random.Generator, stops: tuple[str, ...]) -> Iterator[Piece]:
        with self._exclusive(), _Interrupt() as interrupt:
            stats = self.stats = Stats(prompt_tokens=n_prompt)
            eos = set(self.codec.eos_ids)
            generated: list[int] = []
            emitted = ""
            start = time.perf_counter()
            self._pending = []
            token = self._feed(ids, params, rng.random())
            stats.prefill_seconds = time.perf_counter() - start
            start = time.perf_counter()
            while True:
                if token in eos:
                    stats.finish_reason = "eos"
                    break
                generated.append(token)
                stats.generated_tokens = len(generated)
                text = self.codec.decode(generated)
                cut = min((text.find(s) for s in stops if s in text), default=-1)
                if cut >= 0:
                    text = text[:cut]
                # Hold back a trailing partial UTF-8 character and a tail that may grow into a stop string.
                ready = len(text) if cut >= 0 else len(text) - _pending_stop(text, stops)
                while ready > len(emitted) and text[ready - 1] == "\ufffd":
                    ready -= 1
                yield Piece(token, text[len(emitted):ready] if ready > len(emitted) else "")
                emitted = text[:max(ready, len(emitted))]
                stats.finish_reason = ("stop" if cut >= 0 else "interrupted" if interrupt.requested
                                       else "length" if len(generated) >= max_tokens
                                       else "context" if self.engine.position + 1 >= self.engine.context else "")
                if stats.finish_reason:
                    break
                token = self._feed([token], params, rng.random())
            self._pending = [token]
            stats.decode_seconds = time.perf_counter() - start
