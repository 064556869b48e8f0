"""Generation over any decode engine: streamed and whole answers, stop conditions, prefix reuse across calls,
Ctrl-C at a token boundary, chats whose messages are text.

An engine appends token ids to its sequence and returns the next token, sampled by its own rules from a
uniform draw u (strata.sampling); the GPU session samples on the device and returns only the id, the
reference engine samples its numpy logits. An engine that verifies appends several ids at once and returns every
row's logits, which a session with a drafter accepts here (strata.sampling.verify_drafts), truncating the engine
to what it accepted. Everything above that line lives here, once.

Structured output (strata.generation.constraints): a call with a JSON schema, a regular expression or a grammar hands
the engine, with each draw's sampling parameters, the tokens its grammar allows there (SamplingParams.token_mask), on
an engine whose sampler takes a mask (`token_masks`); the constraint advances by every token drawn.
"""

from __future__ import annotations

import signal
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from strata.chat import render_chat, render_chat_segments
from strata.errors import FormatError, InvalidArgument, StrataError
from strata.generation.arguments import OptionRefused, checked_flag, checked_integer, checked_number
from strata.generation.constraints import CONSTRAINT_OPTIONS, Constraint, Grammar, can_mask, compile_constraint
from strata.generation.draft_length import DraftLength, FixedDraftLength
from strata.generation.drafts import Drafter
from strata.generation.prefix import Snapshots, common_prefix
from strata.generation.records import FINISH_REASONS, Completion, Engine, Piece, Stats, TextCodec, Usage
from strata.generation.text import TextStream
from strata.options import DEFAULT_CONTEXT
from strata.sampling import SamplingParams, TokenMask, log_probabilities, verify_drafts

MAX_LOGPROBS = 20  # the most alternatives a position reports (OpenAI's limit)
RANDOM_SEED = -1  # seed=-1, as on the command line: a fresh random seed (as None)
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                    "presence_penalty", "logit_bias", "seed", "stop", "ignore_eos", "logprobs")
# what Session.render gives the template itself: template_options cannot replace them
RESERVED_TEMPLATE_VALUES = ("messages", "add_generation_prompt", "bos_token", "eos_token")

__all__ = ["CONSTRAINT_OPTIONS", "FINISH_REASONS", "Completion", "Engine", "Piece", "Session", "Stats", "TextCodec",
           "Usage", "session_context"]


def session_context(context: int | None, context_length: int) -> int:
    """The context a session holds: `context`, default min(context_length, 4096); refused outside the model's.
    Every engine's session is sized by this one rule."""
    if context is None:
        context = min(context_length, DEFAULT_CONTEXT)
    context = checked_integer("context", context)
    if not 1 <= context <= context_length:
        raise InvalidArgument(f"context {context} is outside 1..{context_length} (the model's context_length)")
    return context


@dataclass
class _Interrupt:
    """SIGINT while the session computes only raises a flag: the call stops at the next token boundary, the
    session holding what the caller was given, and then raises KeyboardInterrupt. While a piece is with the
    caller (`paused`), Ctrl-C is the caller's own, as anywhere else in the program: the handler, installed once for
    the call (main thread only), hands it to the one the program had, as that one would take it. So a token costs
    no handler swap (two signal.signal calls, about a third of a Session's own time a token)."""

    requested: bool = False
    previous: Any = field(default=None)
    installed: bool = False
    with_caller: bool = False

    def __enter__(self) -> _Interrupt:
        self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        self._uninstall()

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.with_caller = True
        try:
            yield
        finally:
            self.with_caller = False
            # the caller may have set a handler of its own meanwhile: that one is the program's now
            if self.installed and signal.getsignal(signal.SIGINT) != self._handle:
                self._install()

    def _install(self) -> None:
        # only the main thread takes signals; a handler Python did not install (None) cannot be put back
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None:
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True

    def _uninstall(self) -> None:
        if self.installed:
            if signal.getsignal(signal.SIGINT) == self._handle:  # else the caller's own, which stays
                signal.signal(signal.SIGINT, self.previous)
            self.installed = False

    def _handle(self, signum: int, frame: object) -> None:
        if not self.with_caller:
            self.requested = True
        elif callable(self.previous):
            self.previous(signum, frame)
        elif self.previous == signal.SIG_DFL:  # what the default does: end the process as the signal would
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)


@dataclass(frozen=True)
class _Request:
    """One call's checked arguments."""

    params: SamplingParams
    max_tokens: int | None
    stops: tuple[str, ...]
    seed: int | None
    logprobs: int | None
    ignore_eos: bool = False
    grammar: Grammar | None = None  # the call's constraint, compiled
    constraint: Constraint | None = None  # its state while the call generates


class Session:
    """A sequence on an engine that carries over between calls until `reset`.

    `generate(prompt)` continues the sequence with `prompt`; `stream(prompt)` and `complete(prompt)` take the
    prompt as the whole sequence and feed only what the session does not hold yet (rolling back to the latest
    state snapshot before the first difference where the engine keeps snapshots); `chat(messages)` renders
    the conversation and streams like `stream`. Whatever the caller received is what the session holds: the
    last token of a call (also one left early, by `break`, an exception or Ctrl-C) is fed at the start of the
    next. Ctrl-C while the session computes ends the call at the next token boundary and then raises
    KeyboardInterrupt to the caller. One call at a time; a new call from the thread that left an earlier one
    unfinished closes it.

    With a `drafter` (strata.generation.drafts) and an engine that verifies (records.Engine), each decode step
    verifies the pending token and up to `draft_tokens` drafts in one engine call, as many as `draft_length` (by
    default the adaptive strata.generation.draft_length.DraftLength) chooses, and yields the tokens accepted and
    the one after them: greedy output is stepping's exactly, sampled output distributed as stepping's (a seed
    then reproduces tokens only as far as the windows repeat: the adaptive policy's follow timings).
    """

    def __init__(self, engine: Engine, codec: TextCodec, drafter: Drafter | None = None, draft_tokens: int = 0, *,
                 draft_length: DraftLength | FixedDraftLength | None = None):
        self.engine, self.codec = engine, codec
        self.drafter = drafter
        self.draft_length = self._draft_policy(drafter, draft_tokens, draft_length)
        self.stats = Stats()
        self._lock = threading.Lock()
        self._history: list[int] = []  # every token fed to the engine (the repetition penalty's "seen")
        self._pending: list[int] = []  # the last token produced, not yet fed
        self._snapshots = Snapshots(getattr(engine, "snapshots", 0))
        # The unfinished stream and its thread, held weakly: a stream the caller drops is closed at once.
        self._open: tuple[weakref.ref, int] | None = None

    def _draft_policy(self, drafter: Drafter | None, draft_tokens: int,
                      draft_length: DraftLength | FixedDraftLength | None) -> DraftLength | FixedDraftLength | None:
        """What chooses each step's drafts, None without a drafter; refuses drafts the engine cannot verify."""
        if checked_integer("draft_tokens", draft_tokens) < 0:
            raise InvalidArgument(f"draft_tokens must be >= 0, got {draft_tokens}")
        if drafter is None:
            if draft_tokens or draft_length is not None:
                raise InvalidArgument("draft_tokens and draft_length need a drafter")
            return None
        rows = getattr(self.engine, "verify_rows", 0)
        if rows < 2:
            raise InvalidArgument(f"this engine cannot verify drafts (verify_rows {rows}; it needs at least 2)")
        if not 1 <= draft_tokens <= rows - 1:
            raise InvalidArgument(f"draft_tokens must be in 1..{rows - 1} (the engine verifies at most {rows} ids "
                                  f"at once), got {draft_tokens}")
        return DraftLength(draft_tokens) if draft_length is None else draft_length

    # ----------------------------------------------------------------------------------------- the sequence

    @property
    def tokens(self) -> list[int]:
        """The sequence the session stands for: every token fed, then the one produced last (not fed yet)."""
        return self._history + self._pending

    @property
    def graphs(self) -> Any:
        """The engine's Graphs (mode, captured, per-stage timing; strata.Graphs), or None for an engine
        without CUDA graphs (the reference)."""
        return getattr(self.engine, "graphs", None)

    @property
    def engine_stats(self) -> dict[str, Any] | None:
        """The engine's counters since it started or was reset (`stats` is the last generation's), or None for
        an engine without them (the reference). The GPU engine's: tokens, seconds per stage, rings, and per layer the routed experts the VRAM
        cache held (`expert_hits`) and the CPU pool computed (`expert_misses`)."""
        stats = getattr(self.engine, "stats", None)
        return stats() if stats is not None else None

    def reset(self) -> None:
        """Forget the sequence: the next call starts from an empty context."""
        with self._exclusive():
            self.engine.reset()
            self._history.clear()
            self._pending.clear()
            self._snapshots.clear()
            self.stats = Stats()

    def set_control_vectors(self, control_vectors: Sequence[tuple[Any, float]] = (),
                            control_layers: tuple[int, int] | None = None) -> None:
        """Steer what is fed from now on with other control vectors (the model's `session(control_vectors=...,
        control_layers=...)` arguments; an empty list: none; docs/control_vectors.md), between calls. The tokens the
        session holds keep the state their vectors gave, as llama.cpp's cache does; reset() feeds them again under
        the new ones. Refused (InvalidArgument) by an engine without control vectors, and before anything changes for
        a file or range the model's session would refuse."""
        setter = getattr(self.engine, "set_control_vectors", None)
        if setter is None:
            raise InvalidArgument("this session's engine takes no control vectors")
        with self._exclusive():
            setter(control_vectors, control_layers)

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

    # --------------------------------------------------------------------------------------------- calls

    def generate(self, prompt: str | Sequence[int], max_tokens: int | None = 256, *, special: bool = False,
                 **sampling: Any) -> Iterator[Piece]:
        """Stream the continuation of the sequence with `prompt` (text, or token ids) appended. `max_tokens`
        None runs until EOS or the context; `special` reads control tokens written in the text (else it is plain
        text). The sampling options (SAMPLING_OPTIONS): temperature (0: greedy), top_k (0: off), top_p, min_p,
        repeat_penalty (1: off), frequency_penalty and presence_penalty (OpenAI's, over the answer's tokens; 0:
        off), logit_bias ({token id: bias}), seed (None or -1: a random one), stop (a string or strings),
        ignore_eos (EOS does not end the answer: it runs to max_tokens or the context), logprobs (that many
        alternatives per token); any other name is refused. frequency_penalty, presence_penalty and logit_bias need
        an engine whose sampler applies them (`full_sampling`: the GPU and reference engines' do).
        Structured output (at most one of them; an engine whose sampler takes a token mask, `token_masks`):
        response_format (OpenAI's: {"type": "json_object"}, or {"type": "json_schema", "json_schema": {"schema":
        ...}}), json_schema (a JSON schema, or its text), grammar (llama.cpp's GBNF text, or a
        strata.generation.constraints.Grammar compiled already), regex (a regular expression the whole answer
        matches): the answer is held to it token by token and ends, with EOS, where it is complete. Logprobs are
        then over the tokens it allows."""
        request = self._request(max_tokens, sampling)
        ids = self._ids(prompt, special)
        self._close_abandoned()  # its last token is part of the sequence this call continues
        return self._start(self.tokens + ids, request)

    def stream(self, prompt: str | Sequence[int], max_tokens: int | None = 256, *, special: bool = False,
               **sampling: Any) -> Iterator[Piece]:
        """Stream the answer to `prompt`, the whole sequence (text, or token ids): the part the session already
        holds is not fed again. Keyword arguments as `generate`."""
        request = self._request(max_tokens, sampling)
        return self._start(self._ids(prompt, special), request)

    def complete(self, prompt: str | Sequence[int], max_tokens: int | None = 256, **kwargs: Any) -> Completion:
        """`stream` to its end: the text, tokens, finish reason and usage (and per-token logprobs)."""
        return self._collect(self.stream(prompt, max_tokens, **kwargs))

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = 256, *,
             template_options: Mapping[str, Any] | None = None, special: bool = False, **kwargs: Any
             ) -> Iterator[Piece]:
        """Stream the assistant's answer to `messages` rendered with the model's chat template (with
        `template_options` such as tools or enable_thinking), encoded as `chat_ids`. Callers pass the whole
        conversation each turn; the session feeds only what it has not seen."""
        return self.stream(self.chat_ids(messages, template_options, special=special), max_tokens, **kwargs)

    def chat_complete(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = 256,
                      **kwargs: Any) -> Completion:
        """`chat` to its end, as `complete`."""
        return self._collect(self.chat(messages, max_tokens, **kwargs))

    def render(self, messages: Sequence[Mapping[str, Any]], template_options: Mapping[str, Any] | None = None
               ) -> str:
        """The prompt text of `messages` under the model's chat template, ready for the assistant's turn."""
        return render_chat(self._template(), messages, **self._template_values(template_options))

    def chat_ids(self, messages: Sequence[Mapping[str, Any]], template_options: Mapping[str, Any] | None = None,
                 *, special: bool = False) -> list[int]:
        """The token ids of `render(messages, template_options)`. Only the markers the template writes itself
        become control tokens: the messages and the template options (tools, their descriptions) are text, so
        a message cannot end its turn or forge another. `special=True` reads control tokens written in them too,
        for a caller who put them there on purpose (a conversation rendered by the caller's own rules)."""
        if checked_flag("special", special):
            return self._ids(self.render(messages, template_options), special=True)
        segments = render_chat_segments(self._template(), messages, getattr(self.codec, "control_tokens", ()),
                                        **self._template_values(template_options))
        ids = [i for text, marker in segments for i in self._encode(text, marker)]
        if not ids:
            raise InvalidArgument("the rendered conversation is empty")
        return ids

    # ---------------------------------------------------------------------------------------- internals

    def _request(self, max_tokens: int | None, options: Mapping[str, Any]) -> _Request:
        unknown = sorted(set(options) - set(SAMPLING_OPTIONS) - set(CONSTRAINT_OPTIONS))
        if unknown:
            raise InvalidArgument(f"unknown option {', '.join(map(repr, unknown))}; the sampling options are "
                                  f"{', '.join(SAMPLING_OPTIONS)}, and the structured output's "
                                  f"{', '.join(CONSTRAINT_OPTIONS)}")
        numbers_given: dict[str, Any] = {
            name: checked_number(name, options[name]) for name in ("temperature", "top_p", "min_p", "repeat_penalty",
                                                                   "frequency_penalty", "presence_penalty")
            if name in options}
        if "top_k" in options:
            numbers_given["top_k"] = checked_integer("top_k", options["top_k"])
        if options.get("logit_bias"):
            numbers_given["logit_bias"] = self._checked_bias(options["logit_bias"])
        params = SamplingParams(**numbers_given)
        extended = params.extended()
        if extended and not getattr(self.engine, "full_sampling", False):
            raise OptionRefused(extended[0], f"{extended[0]}: this engine's sampler does not apply it (the GPU and "
                                "reference engines' samplers do)")
        if max_tokens is not None and checked_integer("max_tokens", max_tokens) < 1:
            raise InvalidArgument(f"max_tokens must be >= 1 (or None: until EOS or the context), got {max_tokens}")
        stop = options.get("stop", ())
        stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, Iterable) else (None,)
        if not all(isinstance(s, str) for s in stops):
            raise InvalidArgument(f"stop must be a string or a list of strings, got {stop!r:.80}")
        seed = options.get("seed")
        if seed is not None and checked_integer("seed", seed) < RANDOM_SEED:
            raise InvalidArgument(f"seed must be >= 0 (or -1 or None: a random one), got {seed}")
        logprobs = options.get("logprobs")
        if logprobs is not None:
            if not 0 <= checked_integer("logprobs", logprobs) <= MAX_LOGPROBS:
                raise InvalidArgument(f"logprobs must be in 0..{MAX_LOGPROBS}, got {logprobs}")
            if not hasattr(self.engine, "logprobs"):
                raise InvalidArgument("this engine does not report log-probabilities")
        ignore_eos = checked_flag("ignore_eos", options.get("ignore_eos", False))
        return _Request(params, max_tokens, tuple(s for s in stops if s), None if seed == RANDOM_SEED else seed,
                        logprobs, ignore_eos, self._grammar(options, ignore_eos))

    def _grammar(self, options: Mapping[str, Any], ignore_eos: bool) -> Grammar | None:
        """The call's constraint (CONSTRAINT_OPTIONS, at most one), compiled; refused by name on an engine whose
        sampler cannot mask tokens, and with ignore_eos (the grammar says where the answer ends)."""
        given = [name for name in CONSTRAINT_OPTIONS if options.get(name) is not None]
        if not given:
            return None
        if len(given) > 1:
            raise OptionRefused(given[1], f"{given[1]}: give one constraint of {', '.join(CONSTRAINT_OPTIONS)}, "
                                f"got {' and '.join(given)}")
        name = given[0]
        if name == "response_format" and isinstance(options[name], Mapping) and options[name].get("type") == "text":
            return None
        if not can_mask(self.engine):
            raise OptionRefused(name, f"{name}: this engine's sampler does not take a token mask (the GPU and "
                                "reference engines' samplers do)")
        if ignore_eos:
            raise OptionRefused("ignore_eos", f"ignore_eos cannot go with {name}: the grammar says where the answer "
                                "ends")
        return compile_constraint(self.codec, name, options[name])

    def _checked_bias(self, bias: Any) -> tuple[tuple[int, float], ...]:
        """logit_bias as SamplingParams holds it, its token ids within the vocabulary (OptionRefused names it)."""
        try:
            pairs = SamplingParams(logit_bias=bias).logit_bias
        except InvalidArgument as error:
            raise OptionRefused("logit_bias", str(error)) from None
        vocab = len(getattr(self.codec, "tokens", ()) or ())
        if vocab and pairs and pairs[-1][0] >= vocab:
            raise OptionRefused("logit_bias", f"logit_bias: token id {pairs[-1][0]} is outside the vocabulary "
                                f"0..{vocab - 1}")
        return pairs

    def _ids(self, prompt: str | Sequence[int], special: bool) -> list[int]:
        checked_flag("special", special)
        if isinstance(prompt, str):
            ids = self.codec.encode(prompt, special=True) if special else self.codec.encode(prompt)
        elif isinstance(prompt, Iterable) and not isinstance(prompt, (bytes, bytearray, Mapping)):
            ids = [checked_integer("prompt's token id", t) for t in prompt]
        else:
            raise InvalidArgument(f"prompt must be text or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InvalidArgument("the prompt is empty")
        vocab = len(getattr(self.codec, "tokens", ()) or ())
        if vocab and not all(0 <= t < vocab for t in ids):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise InvalidArgument(f"prompt token id {bad} is outside the vocabulary 0..{vocab - 1}")
        return ids

    def _encode(self, text: str, marker: bool) -> list[int]:
        return self.codec.encode(text, special=True) if marker else self.codec.encode(text)

    def _template(self) -> str:
        template = getattr(self.codec, "chat_template", None)
        if not template:
            raise FormatError("the model file carries no chat template (tokenizer.chat_template)")
        return template

    def _template_values(self, template_options: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the template is rendered with: the turn's opening, the model's BOS and EOS, and the options."""
        if template_options is not None and not isinstance(template_options, Mapping):
            raise InvalidArgument(f"template_options must be a mapping of names to values, got "
                                  f"{type(template_options).__name__}")
        options = dict(template_options or {})
        bad = [k for k in options if not isinstance(k, str) or k in RESERVED_TEMPLATE_VALUES]
        if bad:
            raise InvalidArgument(f"template_options cannot set {bad[0]!r}: the names must be strings other than "
                                  f"{', '.join(RESERVED_TEMPLATE_VALUES)}")
        return {"add_generation_prompt": True, "bos_token": self._special("bos"), "eos_token": self._special("eos"),
                **options}

    def _special(self, name: str) -> str:
        ids = getattr(self.codec, "special_ids", {}).get(name) or []
        tokens = getattr(self.codec, "tokens", None)
        return tokens[ids[0]] if ids and tokens is not None else ""

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        self._close_abandoned()
        if not self._lock.acquire(blocking=False):
            raise StrataError("this session is already generating; one generate at a time per session")
        try:
            yield
        finally:
            self._lock.release()

    def _close_abandoned(self) -> None:
        """A stream this thread left unfinished (suspended, or never started) is abandoned once the thread makes
        another call: close it, which makes its last token the pending one. Another thread's stream, and the
        stream that is running this code, are in use."""
        if self._open is not None:
            ref, thread = self._open
            stream = ref()
            if stream is not None and thread == threading.get_ident() and not stream.gi_running:
                stream.close()

    def _start(self, target: list[int], request: _Request) -> Iterator[Piece]:
        if len(target) >= self.engine.context:
            raise InvalidArgument(f"the prompt needs {len(target)} tokens of the session's context of "
                                  f"{self.engine.context} (at least one more for the answer); reset() the session "
                                  "or make a larger one")
        self._close_abandoned()
        stream = self._stream(target, request)
        self._open = (weakref.ref(stream), threading.get_ident())
        return stream

    def _collect(self, pieces: Iterator[Piece]) -> Completion:
        got = list(pieces)
        s = self.stats
        return Completion("".join(p.text for p in got), tuple(p.token for p in got), s.finish_reason,
                          Usage(s.prompt_tokens, s.generated_tokens, s.cached_tokens), tuple(got))

    def resumable(self, prompt: Sequence[int]) -> int:
        """How many leading ids of `prompt` (a whole sequence, as `stream` takes it) this session would not feed
        again: what it holds of them, else its latest snapshot before they part (0: it would start over)."""
        keep = min(common_prefix(self._history, prompt), len(prompt) - 1)
        if keep < len(self._history):
            best = self._snapshots.best(keep)
            return 0 if best is None else best[1]
        return keep

    def _reuse(self, target: list[int]) -> int:
        """Bring the engine to the longest prefix of `target` it can hold (at least one token short of it, so
        that feeding the rest yields the next token); returns that prefix's length."""
        keep = self.resumable(target)
        if keep < len(self._history):
            best = self._snapshots.best(keep)
            if best is None:
                self.engine.reset()
            else:
                self.engine.restore(best[0])
            del self._history[keep:]
            self._snapshots.forget_after(keep)
        self._pending = []
        return keep

    def _feed(self, ids: list[int], params: SamplingParams, u: float) -> int:
        try:
            token = self.engine.feed(ids, params, u, self._history + ids)
        except BaseException:
            self._held_after_failure(ids)
            raise
        self._history += ids
        return token

    def _held_after_failure(self, ids: list[int]) -> None:
        """The history as the engine holds it after a feed of `ids` that raised: most leave the engine as it was, but
        one may have fed them and failed only the draw after (the GPU engine's mask computed while its step runs:
        GpuEngine.feed); then they are fed here too, and nothing is pending (the draw that raised is void)."""
        fed = self.engine.position - len(self._history)
        if 0 < fed <= len(ids):
            self._history += ids[:fed]
            self._pending = []

    @staticmethod
    def _masked(request: _Request) -> SamplingParams:
        """The sampling parameters of the next draw: the call's, with its constraint's mask of the tokens allowed
        now."""
        if request.constraint is None:
            return request.params
        return request.params.masked(request.constraint.mask())

    def _feed_prompt(self, target: list[int], held: int, params: SamplingParams, u: float) -> int:
        """Feed target[held:] and return the next token. Where the engine keeps snapshots, the state before the
        prompt's last token is snapshotted on the way (a turn boundary): a later prompt that extends this one,
        repeats it (a retry) or differs only after it then feeds from there."""
        if self._snapshots.slots == 0:
            return self._feed(target[held:], params, u)
        if len(target) - 1 > held:
            ids = target[held:-1]
            self.engine.prefill(ids, self._history + ids)
            self._history += ids
        slot = self._snapshots.slot_for(len(target) - 1)
        if slot is not None:
            self.engine.snapshot(slot)
        return self._feed(target[-1:], params, u)

    def _piece(self, token: int, text: str, request: _Request, row: np.ndarray | None, mask: TokenMask | None
               ) -> Piece:
        """The piece of `token`; its logprobs from the logits `row` a verify gave (the engine's own after a
        truncate are undefined), else from the engine's last step; over the tokens `mask` allowed, if any."""
        if request.logprobs is None:
            return Piece(token, text)
        if row is not None:
            logprob, top = log_probabilities(row, token, request.logprobs, mask)
        elif mask is not None:
            logprob, top = self.engine.logprobs(token, request.logprobs, token_mask=mask)
        else:
            logprob, top = self.engine.logprobs(token, request.logprobs)
        return Piece(token, text, logprob, tuple(top))

    def _tokens(self, request: _Request, rng: np.random.Generator, stats: Stats, first_mask: TokenMask | None
                ) -> Iterator[tuple[int, np.ndarray | None, TokenMask | None]]:
        """The call's tokens in order from the pending one, each with the logits row a verify gave it (None after
        a plain step) and the token mask it was drawn under (None: none). Whenever this is suspended the session
        holds the token it yielded last as pending and the ones before it as fed; closing it leaves the engine
        holding exactly those. The caller advances the constraint by each token before asking for the next."""
        yield self._pending[0], None, first_mask
        while True:
            drafts, draft_probs = self._drafts(request, stats)
            if drafts:
                yield from self._window(drafts, draft_probs, request, rng, stats)
            else:
                params = self._masked(request)
                yield self._step(request, params, rng, stats), None, params.token_mask

    def _drafts(self, request: _Request, stats: Stats) -> tuple[list[int], np.ndarray | None]:
        """This step's drafts and the drafter's distribution over them (None: certain), as many as the policy
        chooses within the engine's rows, the tokens max_tokens leaves and the context (a verify of the pending
        token and k drafts leaves room for the token after them, as a step does)."""
        if self.draft_length is None:
            return [], None
        cap = min(self.engine.verify_rows - 1, self.engine.context - len(self._history) - 2)
        if request.max_tokens is not None:
            cap = min(cap, request.max_tokens - stats.generated_tokens - 1)
        k = self.draft_length.choose(cap)
        if k < 1:
            return [], None
        history = self.tokens
        drafts = self._checked_drafts(self.drafter.propose(history, k)[:k])
        if request.constraint is not None:  # only what the grammar accepts is verified
            drafts = drafts[:request.constraint.valid_prefix(drafts, self.codec.eos_ids)]
        probabilities = getattr(self.drafter, "draft_probs", None)
        return drafts, probabilities(history, drafts) if drafts and probabilities is not None else None

    def _checked_drafts(self, drafts: Sequence[int]) -> list[int]:
        """The drafter's ids, refused outside the vocabulary before the engine sees them (the session stays as
        it was)."""
        vocab = len(getattr(self.codec, "tokens", ()) or ())
        bad = [t for t in drafts if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise InvalidArgument(f"the drafter proposed token id {bad[0]}, outside the vocabulary"
                                  f"{f' 0..{vocab - 1}' if vocab else ''}")
        return [int(t) for t in drafts]

    def _step(self, request: _Request, params: SamplingParams, rng: np.random.Generator, stats: Stats) -> int:
        """Feed the pending token; the next becomes pending (the pending one stays so if the feed raises)."""
        start = time.perf_counter()
        self._pending = [self._feed([self._pending[0]], params, rng.random())]
        if self.draft_length is not None:
            self.draft_length.stepped(time.perf_counter() - start)
        stats.steps += 1
        return self._pending[0]

    def _window(self, drafts: list[int], draft_probs: np.ndarray | None, request: _Request,
                rng: np.random.Generator, stats: Stats
                ) -> Iterator[tuple[int, np.ndarray, TokenMask | None]]:
        """Verify the pending token and `drafts` in one engine call and yield the tokens it accepts and the one
        after them, one by one (each row under its grammar's mask, if any: the state after the drafts before it);
        the engine is truncated to what the caller took, once it stops taking them."""
        ids = [self._pending[0], *drafts]
        fed = len(self._history)
        masks = None if request.constraint is None else request.constraint.draft_masks(drafts)
        start = time.perf_counter()
        rows = self.engine.verify(ids, self._history + ids)
        seconds = time.perf_counter() - start
        try:
            produced = verify_drafts(rows, request.params, drafts, rng.random((len(ids), 2)),
                                     self._history + ids[:1], draft_probs, masks)
            self.draft_length.verified(len(drafts), len(produced) - 1, seconds)
            stats.steps += 1
            stats.drafted += len(drafts)
            stats.accepted += len(produced) - 1
            for i, (fed_before, token, row) in enumerate(zip(ids, produced, rows)):
                self._history.append(fed_before)
                self._pending = [token]
                yield token, row, None if masks is None else masks[i]
        finally:
            # A truncate keeps at least the pending token (the engine cannot go back before it): where nothing
            # was yielded (an error), the engine is one token ahead of the history, as after a failed step.
            held = max(len(self._history), fed + 1)
            if self.engine.position != held:
                self.engine.truncate(held)

    def _stream(self, target: list[int], request: _Request) -> Iterator[Piece]:
        # the answer begins after the whole sequence given: what frequency and presence penalties count
        request = replace(request, params=replace(request.params, answer_start=len(target)),
                          constraint=None if request.grammar is None else request.grammar.start())
        with self._exclusive(), _Interrupt() as interrupt:
            stats = self.stats = Stats(prompt_tokens=len(target))
            eos = set() if request.ignore_eos else set(self.codec.eos_ids)
            text = TextStream(self.codec.decode, request.stops, getattr(self.codec, "byte_level", False))
            rng = np.random.default_rng(request.seed)
            start = time.perf_counter()
            tokens = None  # the call's tokens (_tokens) once the prompt is in
            try:
                stats.cached_tokens = self._reuse(target)
                params = self._masked(request)
                self._pending = [self._feed_prompt(target, stats.cached_tokens, params, rng.random())]
                stats.prefill_seconds = time.perf_counter() - start
                start = time.perf_counter()
                tokens = self._tokens(request, rng, stats, params.token_mask)
                for token, row, mask in tokens:
                    if token in eos:
                        stats.finish_reason = "eos"
                        break
                    stats.generated_tokens += 1
                    new, stopped = text.push(token)
                    piece = self._piece(token, new, request, row, mask)
                    if request.constraint is not None:
                        request.constraint.advance(token, mask)
                    with interrupt.paused():
                        yield piece
                    stats.finish_reason = (
                        "stop" if stopped else "interrupted" if interrupt.requested
                        else "length" if request.max_tokens is not None and stats.generated_tokens >= request.max_tokens
                        else "context" if len(self._history) + 1 >= self.engine.context else "")
                    if stats.finish_reason:
                        break
            except GeneratorExit:
                stats.finish_reason = stats.finish_reason or "cancelled"
                raise
            except BaseException:
                stats.finish_reason = stats.finish_reason or "error"
                raise
            finally:
                stats.decode_seconds = time.perf_counter() - start
                self._open = None
                if tokens is not None:
                    tokens.close()  # a verified window left partway is truncated to what the caller took
        if interrupt.requested:  # the session is consistent and the signal handler is the caller's again
            raise KeyboardInterrupt
