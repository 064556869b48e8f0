"""Token sampling: the numpy definition the GPU sampler is checked against.

Order of operations (llama.cpp's sampler chain): logit bias, repetition penalty on the tokens seen, frequency
and presence penalties on the answer's tokens (OpenAI's definitions), the token mask (structured output: the tokens
a grammar allows, `TokenMask`; every other token is out before any filter), temperature, top-k, top-p, min-p, then
one draw. The GPU sampler (cuda/src/kernels/sample.cu) applies every step, in this order; an engine whose sampler
applies them all says so (`full_sampling`, and `token_masks` for the mask). A draw is a pure function of the
filtered distribution and one uniform number u in [0, 1), so the GPU and this module pick the same token for the
same u.
Ties are broken towards the lower token id everywhere (greedy, top-k, the sorted order of a draw).

Drafted tokens (speculative decoding) are verified by `accept_draft`, position by position (`verify_drafts`):
greedy accepts exactly the token stepping would pick; sampling keeps the standard speculative-sampling rule, so
the tokens a step yields are distributed as stepping's whatever the drafter proposed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strata.errors import InvalidArgument

MAX_PENALTY = 2.0  # |frequency_penalty| and |presence_penalty| at most (OpenAI's range)
MAX_BIAS = 100.0  # |a logit bias| at most (OpenAI's range)
# The fields an engine's sampler may lack (one that applies them has `full_sampling` true: the GPU's and this one's).
EXTENDED = ("logit_bias", "frequency_penalty", "presence_penalty")
MASK_BITS = 32  # tokens per word of a TokenMask


class TokenMask:
    """The tokens the next draw may pick (structured output): bit t % 32 of the int32 word t // 32 is set where token
    t is allowed, llguidance's and xgrammar's layout; a token past the words' bits (logits wider than the tokenizer's
    vocabulary) is never allowed. `words` holds `size` words, computed on first use where the mask was made with
    `compute` (a function that writes them into the int32 array it is given) and kept; `fill(out)` writes them into an
    engine's own buffer, computing them straight there when they were not yet (what lets an engine compute the mask
    while its device runs the step: docs/api.md, "Structured output"). A mask is valid during the engine call it came
    with; it never changes once computed."""

    __slots__ = ("size", "_words", "_compute")

    def __init__(self, words: np.ndarray | None = None, *, size: int | None = None,
                 compute: Callable[[np.ndarray], None] | None = None):
        if (words is None) == (compute is None):
            raise InvalidArgument("a TokenMask takes its words or a function that computes them, not both")
        if words is not None:
            words = np.ascontiguousarray(words, dtype=np.int32).reshape(-1)
            size = words.size
        if size is None or size < 1:
            raise InvalidArgument(f"a TokenMask has at least one word, got {size}")
        self.size, self._words, self._compute = int(size), words, compute

    @classmethod
    def allowing(cls, tokens: Iterable[int], vocab: int) -> TokenMask:
        """The mask of exactly `tokens` over a vocabulary of `vocab` ids."""
        bits = np.zeros(-(-vocab // MASK_BITS) * MASK_BITS, np.uint8)
        bits[np.fromiter(tokens, np.int64)] = 1
        return cls(np.packbits(bits, bitorder="little").view(np.int32))

    @property
    def words(self) -> np.ndarray:
        """int32 [size]: the mask's words (computed now if they were not yet)."""
        if self._words is None:
            out = np.zeros(self.size, np.int32)
            self.fill(out)
        return self._words

    @property
    def computed(self) -> bool:
        """Whether the words are known (given, or computed by `words` or `fill`)."""
        return self._words is not None

    def fill(self, out: np.ndarray) -> None:
        """Write the words into `out` (C-contiguous int32, at least `size` words; any words past them are set to 0:
        no token there is allowed)."""
        if out.dtype != np.int32 or out.ndim != 1 or not out.flags.c_contiguous or out.size < self.size:
            raise InvalidArgument(f"a TokenMask fills a C-contiguous int32 array of >= {self.size} words, got "
                                  f"{out.dtype} {out.shape}")
        if self._words is None:
            self._compute(out[:self.size])
            self._words = out[:self.size].copy()
        else:
            out[:self.size] = self._words
        out[self.size:] = 0

    def allowed(self, n: int) -> np.ndarray:
        """bool [n]: whether each of the first n token ids is allowed."""
        bits = np.unpackbits(self.words.view(np.uint8), bitorder="little").astype(bool)
        if bits.size >= n:
            return bits[:n]
        return np.concatenate([bits, np.zeros(n - bits.size, bool)])


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0  # 1 means off
    frequency_penalty: float = 0.0  # subtracted from a token's logit once per time it is in the answer so far
    presence_penalty: float = 0.0  # subtracted once from the logit of a token that is in the answer so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); a mapping is taken too
    answer_start: int = 0  # where in `seen` the answer begins: the two penalties count seen[answer_start:]
    # the tokens this draw may pick (structured output), None: every token; not part of the parameters' identity
    token_mask: TokenMask | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Plain Python numbers, so a numpy scalar argument cannot change the arithmetic's precision.
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "answer_start", int(self.answer_start))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.token_mask is not None and not isinstance(self.token_mask, TokenMask):
            raise InvalidArgument(f"token_mask must be a TokenMask or None, got {type(self.token_mask).__name__}")
        if not all(math.isfinite(value) for value in (self.temperature, self.top_p, self.min_p, self.repeat_penalty,
                                                      self.frequency_penalty, self.presence_penalty)):
            raise InvalidArgument(f"sampling parameters must be finite, got {self}")
        # each message made only where its check fails: a constrained answer makes a new SamplingParams every token
        checks = [
            (self.temperature >= 0.0, lambda: f"temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            (self.top_k >= 0, lambda: f"top_k must be >= 0 (0 = off), got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, lambda: f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p < 1.0, lambda: f"min_p must be in [0, 1), got {self.min_p}"),
            (self.repeat_penalty > 0.0, lambda: f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}"),
            (abs(self.frequency_penalty) <= MAX_PENALTY,
             lambda: f"frequency_penalty must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {self.frequency_penalty}"),
            (abs(self.presence_penalty) <= MAX_PENALTY,
             lambda: f"presence_penalty must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {self.presence_penalty}"),
            (self.answer_start >= 0, lambda: f"answer_start must be >= 0, got {self.answer_start}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message())

    def masked(self, mask: TokenMask | None) -> SamplingParams:
        """These parameters with `mask` as the token mask: a copy without checking again what was checked when these
        were made (a constrained answer makes one every token)."""
        if mask is not None and not isinstance(mask, TokenMask):
            raise InvalidArgument(f"token_mask must be a TokenMask or None, got {type(mask).__name__}")
        copy = object.__new__(SamplingParams)
        copy.__dict__.update(self.__dict__)
        object.__setattr__(copy, "token_mask", mask)
        return copy

    def extended(self) -> list[str]:
        """The EXTENDED fields this sets away from their neutral value (what only the numpy definition applies)."""
        return [name for name in EXTENDED if getattr(self, name)]


def _bias_pairs(bias: Mapping[Any, Any] | Iterable[Any]) -> tuple[tuple[int, float], ...]:
    """A logit bias as sorted (token id, bias) pairs, one per id (the last given wins), each checked: an id >= 0
    (whether it is in the vocabulary, the logits tell), a finite bias of at most MAX_BIAS either way."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    pairs: dict[int, float] = {}
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise InvalidArgument(f"logit_bias takes (token id, bias) pairs or a mapping, got {item!r:.80}")
        token, value = item
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
            raise InvalidArgument(f"logit_bias: token ids are integers >= 0, got {token!r:.80}")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not abs(float(value)) <= MAX_BIAS:
            raise InvalidArgument(f"logit_bias: token {token}'s bias must be a number in [-{MAX_BIAS}, {MAX_BIAS}], "
                                  f"got {value!r:.80}")
        pairs[int(token)] = float(value)
    return tuple(sorted(pairs.items()))


def apply_repeat_penalty(logits: np.ndarray, seen: Iterable[int], penalty: float) -> np.ndarray:
    """Positive logits of seen tokens are divided by the penalty, negative ones multiplied (once per id)."""
    out = logits.astype(np.float32, copy=True)
    if penalty == 1.0:
        return out
    ids = np.unique(np.fromiter(seen, dtype=np.int64))
    if ids.size:
        picked = out[ids]
        out[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def candidates(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and probabilities left after temperature, top-k, top-p and min-p, most likely first."""
    # A stable sort of -logits orders by logit descending with ties towards the lower id.
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    if not np.isfinite(logits[order[-1]]):  # a token mask's -inf sort last: they are no candidates
        order = order[:np.count_nonzero(np.isfinite(logits))]
    if params.top_k:
        order = order[: params.top_k]
    with np.errstate(over="ignore"):
        scaled = logits[order].astype(np.float64) / params.temperature
        if np.isinf(scaled[0]):  # a temperature so small that logit / t overflows: relative to the largest, the
            scaled = (logits[order].astype(np.float64) - float(logits[order[0]])) / params.temperature  # limit
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (at least one token).
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        order, probs = order[:keep], probs[:keep]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return order, probs / probs.sum()


def _checked_uniform(u: float) -> None:
    if not 0.0 <= u < 1.0:
        raise InvalidArgument(f"the uniform draw must be in [0, 1), got {u}")


def _penalized(logits: np.ndarray, params: SamplingParams, seen: Iterable[int]) -> np.ndarray:
    """The logits a draw is made from: biased, then penalized (the module's order)."""
    penalties = params.frequency_penalty or params.presence_penalty
    if params.repeat_penalty != 1.0 or penalties:
        seen = np.fromiter(seen, dtype=np.int64)
    out = np.asarray(logits)
    if params.logit_bias:
        out = out.astype(np.float32, copy=True)
        ids, bias = np.array(params.logit_bias, dtype=np.float64).T
        if ids[-1] >= out.size:
            raise InvalidArgument(f"logit_bias: token {int(ids[-1])} is outside the {out.size} logits")
        out[ids.astype(np.int64)] += bias.astype(np.float32)
    out = apply_repeat_penalty(out, seen, params.repeat_penalty)
    if penalties:
        ids, counts = np.unique(seen[params.answer_start:], return_counts=True)
        out[ids] -= (counts * params.frequency_penalty + params.presence_penalty).astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise InvalidArgument("logits contain NaN or infinity")
    return _masked(out, params.token_mask)


def _masked(logits: np.ndarray, mask: TokenMask | None) -> np.ndarray:
    """`logits` with every token `mask` does not allow at -inf (unchanged without a mask)."""
    if mask is None:
        return logits
    allowed = mask.allowed(logits.size)
    if not allowed.any():
        raise InvalidArgument("the token mask allows no token of the logits")
    out = np.array(logits, dtype=np.float32, copy=True)
    out[~allowed] = -np.inf
    return out


def _draw(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The id whose cumulative mass (in the order given) first passes u."""
    index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(index, ids.size - 1)])


def sample(logits: np.ndarray, params: SamplingParams, u: float, seen: Iterable[int] = ()) -> int:
    """The token for one uniform draw u in [0, 1)."""
    _checked_uniform(u)
    logits = _penalized(logits, params, seen)
    if params.temperature == 0.0:
        return int(np.argmax(logits))  # argmax returns the first (lowest) id among ties
    return _draw(*candidates(logits, params), u)


def accept_draft(logits: np.ndarray, params: SamplingParams, draft: int, u_accept: float, u_residual: float,
                 seen: Iterable[int] = (), draft_probs: np.ndarray | None = None) -> tuple[bool, int]:
    """Whether the drafted token `draft` is accepted at a position whose logits are `logits`, and the token the
    position yields: the draft, or on a rejection a draw from the residual distribution.

    Greedy (temperature 0) accepts exactly the token `sample` would pick, and yields it either way. Sampling
    accepts with probability min(1, p(d) / q(d)) (u_accept < p(d) / q(d)), p the distribution `sample` draws from
    and q the drafter's over the vocabulary (`draft_probs`; None: the drafter proposed d with certainty, as prompt
    lookup and a greedy drafter do); a rejection draws with u_residual from max(0, p - q), renormalised, in
    `candidates`' order. The token yielded is then distributed as p, whatever q (Leviathan et al., 2023)."""
    _checked_uniform(u_accept)
    _checked_uniform(u_residual)
    logits = _penalized(logits, params, seen)
    if not 0 <= draft < logits.size:
        raise InvalidArgument(f"draft token {draft} is outside the {logits.size} logits")
    if params.temperature == 0.0:
        best = int(np.argmax(logits))
        return best == draft, best
    ids, probs = candidates(logits, params)
    p = np.zeros(logits.size, np.float64)
    p[ids] = probs
    if draft_probs is None:
        q = np.zeros(logits.size, np.float64)
        q[draft] = 1.0
    else:
        q = np.asarray(draft_probs, np.float64).reshape(-1)
        if q.size != logits.size or not np.all(np.isfinite(q)) or np.any(q < 0) or q[draft] <= 0:
            raise InvalidArgument(f"draft_probs must be {logits.size} finite probabilities, with q(draft) > 0")
    if u_accept * q[draft] < p[draft]:
        return True, draft
    residual = np.maximum(p[ids] - q[ids], 0.0)
    total = residual.sum()
    if total <= 0.0:  # p <= q on every candidate: only rounding can reject here; the draw from p is exact then
        return False, _draw(ids, probs, u_residual)
    return False, _draw(ids, residual / total, u_residual)


def verify_drafts(rows: np.ndarray, params: SamplingParams, drafts: list[int], uniforms: np.ndarray,
                  seen: Iterable[int] = (), draft_probs: np.ndarray | None = None,
                  masks: list[TokenMask] | None = None) -> list[int]:
    """The tokens one verification step yields: `rows` [k + 1, vocab] are the logits after the context and after
    each of the k drafts; position i accepts drafts[i] or yields its replacement and stops; when every draft is
    accepted, the last row yields one token more. `uniforms` [k + 1, 2]: position i's (u_accept, u_residual), the
    last row's draw in uniforms[k, 0]. The penalty's seen tokens grow by each token yielded, as when stepping;
    `draft_probs` [k, vocab] is the drafter's distribution per position (None: certain drafts); `masks` (structured
    output) the token mask of each of the k + 1 rows, row i's the grammar's after drafts[:i] (None: params' own)."""
    k = len(drafts)
    if masks is not None:
        if len(masks) != k + 1:
            raise InvalidArgument(f"{k} drafts need {k + 1} token masks, got {len(masks)}")
        rows_params = [params.masked(mask) for mask in masks]
    else:
        rows_params = [params] * (k + 1)
    rows = np.asarray(rows)
    uniforms = np.asarray(uniforms, np.float64)
    if rows.ndim != 2 or rows.shape[0] != k + 1 or uniforms.shape != (k + 1, 2):
        raise InvalidArgument(f"{k} drafts need {k + 1} rows of logits and ({k + 1}, 2) uniforms, got "
                              f"{rows.shape} and {uniforms.shape}")
    seen = list(seen)
    out: list[int] = []
    for i, draft in enumerate(drafts):
        q = None if draft_probs is None else draft_probs[i]
        accepted, token = accept_draft(rows[i], rows_params[i], int(draft), uniforms[i, 0], uniforms[i, 1], seen, q)
        out.append(token)
        seen.append(token)
        if not accepted:
            return out
    out.append(sample(rows[k], rows_params[k], float(uniforms[k, 0]), seen))
    return out


def log_probabilities(logits: np.ndarray, token: int, n: int, token_mask: TokenMask | None = None
                      ) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` and the `n` most likely ids with theirs, under the model's distribution at
    that position: the softmax of the raw logits (before the repetition penalty and temperature), computed in
    float64; ties go to the lower id. With a `token_mask` (structured output) the softmax is over the allowed tokens
    only, as OpenAI reports them: the alternatives are allowed tokens (fewer than n where fewer are allowed), and
    `token` must be one. The GPU engine's logprobs follow this definition."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not 0 <= token < x.size:
        raise InvalidArgument(f"token {token} is outside the {x.size} logits")
    if token_mask is not None:
        allowed = token_mask.allowed(x.size)
        if not allowed[token]:
            raise InvalidArgument(f"token {token} is not one the token mask allows")
        x = np.where(allowed, x, -np.inf)
        n = min(n, int(np.count_nonzero(allowed)))
    log_z = float(np.max(x) + np.log(np.sum(np.exp(x - np.max(x)))))
    top = np.argsort(-x, kind="stable")[:n]
    return float(x[token] - log_z), [(int(i), float(x[i] - log_z)) for i in top]
