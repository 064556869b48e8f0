"""Token sampling: the numpy definition the GPU sampler is checked against.

Order of operations (llama.cpp's and transformers' usual order): repetition penalty on the tokens seen,
temperature, top-k, top-p, min-p, then one draw. A draw is a pure function of the filtered distribution and
one uniform number u in [0, 1), so the GPU and this module pick the same token for the same u.
Ties are broken towards the lower token id everywhere (greedy, top-k, the sorted order of a draw).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from strata.errors import InvalidArgument


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0  # 1 means off

    def __post_init__(self) -> None:
        # Plain Python numbers, so a numpy scalar argument cannot change the arithmetic's precision.
        for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "top_k", int(self.top_k))
        if not np.all(np.isfinite([self.temperature, self.top_p, self.min_p, self.repeat_penalty])):
            raise InvalidArgument(f"sampling parameters must be finite, got {self}")
        checks = [
            (self.temperature >= 0.0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p < 1.0, f"min_p must be in [0, 1), got {self.min_p}"),
            (self.repeat_penalty > 0.0, f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)


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
    if params.top_k:
        order = order[: params.top_k]
    scaled = logits[order].astype(np.float64) / params.temperature
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


def sample(logits: np.ndarray, params: SamplingParams, u: float, seen: Iterable[int] = ()) -> int:
    """The token for one uniform draw u in [0, 1)."""
    if not 0.0 <= u < 1.0:
        raise InvalidArgument(f"the uniform draw must be in [0, 1), got {u}")
    logits = apply_repeat_penalty(np.asarray(logits), seen, params.repeat_penalty)
    if not np.all(np.isfinite(logits)):
        raise InvalidArgument("logits contain NaN or infinity")
    if params.temperature == 0.0:
        return int(np.argmax(logits))  # argmax returns the first (lowest) id among ties
    ids, probs = candidates(logits, params)
    index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(index, ids.size - 1)])


def log_probabilities(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` and the `n` most likely ids with theirs, under the model's distribution at
    that position: the softmax of the raw logits (before the repetition penalty and temperature), computed in
    float64; ties go to the lower id. The GPU engine's logprobs follow this definition."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not 0 <= token < x.size:
        raise InvalidArgument(f"token {token} is outside the {x.size} logits")
    log_z = float(np.max(x) + np.log(np.sum(np.exp(x - np.max(x)))))
    top = np.argsort(-x, kind="stable")[:n]
    return float(x[token] - log_z), [(int(i), float(x[i] - log_z)) for i in top]
