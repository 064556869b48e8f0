"""What generation works with and hands back: the engine and codec it drives, and the records it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from strata.sampling import SamplingParams

FINISH_REASONS = ("eos", "stop", "length", "context", "interrupted", "cancelled", "error")


class Engine(Protocol):
    """A sequence of token ids that an engine extends and samples from.

    Optional abilities, looked up with getattr: `snapshots` (how many states it can keep) with
    `snapshot(slot)` / `restore(slot)` (save the state after `position` tokens, go back to it) and
    `prefill(ids, seen)` (append ids, no token wanted); `logprobs(token, n)` (the log-probability of `token` and
    the n most likely ids at the last fed position); `close()`; `full_sampling` (true: feed applies every
    SamplingParams field, as strata.sampling.sample does; absent or false: temperature, top_k, top_p, min_p and
    repeat_penalty only, so a Session refuses the others); `token_masks` (true: feed and
    step_batch apply SamplingParams.token_mask, the tokens a constraint allows, and `logprobs(token, n, token_mask)`
    is over them; absent or false: a Session refuses structured output; docs/api.md, "The engine's side");
    `set_control_vectors(control_vectors, control_layers)` (the control vectors added from the next token on:
    docs/control_vectors.md).

    Verifying drafts (a Session with a drafter uses them): `verify_rows`, the most ids one `verify` takes (0 or
    absent: the engine cannot verify); `verify(ids, seen)` appends `ids` (seen: the history including them, as
    feed takes it) and returns float32 [len(ids), n_vocab], row i the logits after ids[i], keeping each row's
    state so that right after it `truncate(position)` takes the sequence back to exactly the state after
    `position` tokens, for any position in [p0 + 1, p0 + len(ids)] (p0: the position before the verify;
    p0 + len(ids) changes nothing). truncate is valid only between a verify and the next feed, verify, prefill,
    snapshot or restore (else InvalidArgument); after it, `logprobs` is undefined: the session computes the
    verified positions' from the rows (strata.sampling.log_probabilities).
    """

    context: int   # the most tokens the sequence may hold
    position: int  # tokens in the sequence so far

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """Append `ids` to the sequence; return the next token for the draw `u`. A feed that raises leaves the
        sequence as it was, or holding `ids` with the draw void (the GPU engine's mask computed while its step
        runs: docs/api.md, "The engine's side"); `position` tells which."""
        ...

    def reset(self) -> None: ...


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    @property
    def eos_ids(self) -> list[int]: ...
    # A model's tokenizer also carries `chat_template` (str | None), `tokens` (the vocabulary), `control_tokens`
    # (their texts: a chat template's markers) and `encode(text, special=True)`, which reads control tokens
    # written in the text.


@dataclass(frozen=True)
class Piece:
    """One generated token and the text it completed (may be empty while a character or stop is pending).
    With logprobs asked for: the token's log-probability and the most likely alternatives at its position."""

    token: int
    text: str
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, already held by the session and not fed again
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str = ""  # one of FINISH_REASONS once the call has ended
    steps: int = 0  # engine calls while decoding: plain steps and verifies
    drafted: int = 0  # tokens drafted and verified
    accepted: int = 0  # of them, accepted

    @property
    def decode_tokens_per_second(self) -> float:
        return (self.generated_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts per drafted token (0 without drafts)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens generated per decode step (the first comes from the prompt, as in decode_tokens_per_second);
        1 when stepping plainly, up to draft_tokens + 1 with drafts."""
        return (self.generated_tokens - 1) / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """A finished (non-streaming) generation."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    usage: Usage
    pieces: tuple[Piece, ...] = field(default=(), repr=False)  # per token, with logprobs when asked for
