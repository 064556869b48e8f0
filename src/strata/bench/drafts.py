"""Drafted decoding on one session (docs/speculative.md): what a verification step of k drafts costs against a
plain step, and greedy decode speed with drafts accepted at forced rates (ForcedDrafter: the target's own greedy
continuation, each draft right with probability p) against plain decode, side by side on the same engine."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from strata.generation import Session


def _median_seconds(call: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:] if reps > 2 else times))  # the first may hold a warm-up


def verify_costs(session: Session, prompt: list[int], drafts: list[int], reps: int, vocab: int,
                 rng: np.random.Generator) -> dict[str, float]:
    """Seconds of a plain step, and of a verification step of k drafts (k + 1 rows of random ids below `vocab`,
    then the cut back to its first row) as a multiple of it, for each k in `drafts`: the cost the draft length
    policy weighs."""
    engine = session.engine
    session.reset()
    history = list(prompt)
    engine.prefill(history, history)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, vocab, n)]

    def plain() -> None:
        token = ids(1)
        history.extend(token)
        engine.prefill(token, history)

    out = {"step_seconds": _median_seconds(plain, reps)}
    for k in drafts:
        def verify() -> None:
            window = ids(k + 1)
            engine.verify(window, history + window)
            engine.truncate(len(history) + 1)
            history.append(window[0])

        out[f"verify_{k}_steps"] = _median_seconds(verify, reps) / out["step_seconds"]
    return out


def forced_decode(session: Session, prompt: list[int], tokens: int, drafts: int, rates: list[float], vocab: int,
                  seed: int = 0) -> dict[str, Any]:
    """Greedy decode of `tokens` after `prompt`, plainly and with `drafts` drafts a step (a fixed length) right with
    each probability in `rates`: tok/s, the ratio to plain, tokens per step and the acceptance measured, and
    whether the tokens were the drafted path's own greedy ones (the output must not change with the rate). The
    drafts follow the verification rows' greedy continuation, taken from a run whose every draft is wrong: on a
    model with near-ties (a synthetic one) stepping's continuation may part from it, since the decode step and the
    verification step sum in other orders, and would then be drafted wrong from there on."""
    from strata.generation import Session as GenerationSession
    from strata.generation.draft_length import FixedDraftLength
    from strata.generation.drafts import ForcedDrafter

    def drafted(p: float, continuation: list[int]) -> tuple[tuple[int, ...], Any]:
        session.engine.reset()  # from an empty sequence, as the plain run
        run = GenerationSession(session.engine, session.codec, ForcedDrafter(continuation, p, seed, vocab=vocab),
                                drafts, draft_length=FixedDraftLength(drafts))
        return run.complete(prompt, tokens, temperature=0).tokens, run.stats

    session.reset()
    plain = session.complete(prompt, tokens, temperature=0)
    plain_rate = (len(plain.tokens) - 1) / session.stats.decode_seconds
    verified, _ = drafted(0.0, list(prompt) + list(plain.tokens))
    out: dict[str, Any] = {"plain_tokens_per_second": plain_rate, "tokens": len(verified),
                           "stepping_agrees": verified == plain.tokens, "rates": {}}
    for p in rates:
        got, s = drafted(p, list(prompt) + list(verified))
        rate = (len(got) - 1) / s.decode_seconds
        out["rates"][p] = {"tokens_per_second": rate, "speedup": rate / plain_rate,
                           "tokens_per_step": s.tokens_per_step, "acceptance": s.acceptance_rate,
                           "same_tokens": got == verified}
    session.engine.reset()
    return out
