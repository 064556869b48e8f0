"""Batched sessions (docs/batch.md): aggregate decode speed of B sessions stepped together (GpuEngine.step_batch)
against one session's plain decode steps, side by side on one loaded model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from strata.generation import Session


def plain_rate(session: Session, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Tokens a second of plain greedy decode steps after `prompt` (the first, the prompt's own, not counted), and
    the tokens."""
    from strata.sampling import SamplingParams

    engine, params = session.engine, SamplingParams()
    session.reset()
    history = list(prompt)
    token = engine.feed(prompt, params, 0.0, history)
    start = time.perf_counter()
    for _ in range(tokens):
        history.append(token)
        token = engine.feed([token], params, 0.0, history)
    return tokens / (time.perf_counter() - start), history[len(prompt):]


def batch_rate(sessions: list[Session], prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """Greedy decode of `tokens` steps of every session at once after its prompt (the engines' step_batch; an engine
    without one, such as the reference, steps each in turn): aggregate and per-session tokens a second, each step's
    seconds (median, worst), and every session's tokens."""
    from strata.sampling import SamplingParams

    engines = [s.engine for s in sessions]
    together = getattr(type(engines[0]), "step_batch", None)
    if together is None:
        def together(engines, ids, params, us, seens):
            return [e.feed([t], p, u, h) for e, t, p, u, h in zip(engines, ids, params, us, seens)]
    params = [SamplingParams()] * len(engines)
    histories = [list(p) for p in prompts]
    for s in sessions:
        s.reset()
    next_tokens = [e.feed(p, params[0], 0.0, h) for e, p, h in zip(engines, prompts, histories)]
    steps = []
    for _ in range(tokens):
        for h, t in zip(histories, next_tokens):
            h.append(t)
        start = time.perf_counter()
        next_tokens = together(engines, next_tokens, params, [0.0] * len(engines), [list(h) for h in histories])
        steps.append(time.perf_counter() - start)
    total = float(np.sum(steps))
    return {"sessions": len(sessions), "tokens_per_second": len(sessions) * tokens / total,
            "per_session_tokens_per_second": tokens / total, "step_ms_median": 1e3 * float(np.median(steps)),
            "step_ms_worst": 1e3 * float(np.max(steps)),
            "tokens": [h[len(p):] for h, p in zip(histories, prompts)]}


def batch_sweep(open_session: Callable[[], Session], prompt: Callable[[int], list[int]], sizes: list[int],
                tokens: int) -> dict[str, Any]:
    """Plain decode of one session, then batches of each size in `sizes` (sessions from open_session, prompts of
    prompt(i)), each against the plain rate; `agrees`: the greedy tokens of the batch's first session are the
    plain run's (a near-tie may part them on a synthetic model: reported, not asserted)."""
    sessions = [open_session() for _ in range(max(sizes))]
    try:
        plain, plain_tokens = plain_rate(sessions[0], prompt(0), tokens)
        out: dict[str, Any] = {"plain_tokens_per_second": plain, "batches": {}}
        for size in sizes:
            got = batch_rate(sessions[:size], [prompt(i) for i in range(size)], tokens)
            got["speedup"] = got["tokens_per_second"] / plain
            got["agrees"] = got.pop("tokens")[0] == plain_tokens
            out["batches"][size] = got
        return out
    finally:
        for s in sessions:
            s.close()
