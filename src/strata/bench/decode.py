"""Greedy decode speed of GPU sessions, per session mode, and where each token's time goes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from strata.options import KV, Mode

if TYPE_CHECKING:
    import numpy as np

    from strata.generation import Session
    from strata.models import Geometry


def prompt_ids(g: Geometry, n: int, rng: np.random.Generator) -> list[int]:
    """`n` random token ids, none of them the PLE's EOS (which would cut the n-gram context)."""
    if not g.ple_layers:
        return [int(t) for t in rng.integers(0, g.n_vocab, n)]
    ids = rng.integers(0, g.n_vocab - 1, n)  # one id fewer, then shifted past EOS
    return [int(t) + int(t >= g.ple_eos) for t in ids]


def stepped(session: Session, prompt: list[int], tokens: int) -> Iterator[int]:
    """The prompt's token, then `tokens` more, each fed through the engine's feed (strata.generation.Engine), not
    Session.generate: exactly `tokens`, past any EOS the model samples."""
    from strata.sampling import SamplingParams

    greedy = SamplingParams()
    engine = session.engine
    history = list(prompt)
    token = engine.feed(prompt, greedy, 0.0, history)
    yield token
    for _ in range(tokens):
        history.append(token)
        token = engine.feed([token], greedy, 0.0, history)
        yield token


def decode(session: Session, prompt: list[int], tokens: int,
           probe: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Greedy decode of `tokens` after `prompt` on a GPU session; seconds per decoded token and its native
    breakdown. Stepped (`stepped`) unless the session drafts: then through Session.generate, which verifies the
    drafts (an EOS ends it sooner), and the result adds the tokens decoded, the acceptance rate and the tokens per
    engine step. `probe` (counters of the caller's, such as the disk tier's) is called right before and right after
    the timed tokens, the prompt's step outside them: the result's "probe" holds its two values."""
    from strata.runtime.engine import STAGES, per_token_timing

    session.reset()
    drafting = session.drafter is not None
    decoding = session.generate(prompt, max_tokens=tokens + 1) if drafting else stepped(session, prompt, tokens)
    next(decoding)  # the prompt's token, not timed
    probed = probe() if probe is not None else None
    before = session.engine_stats
    start = time.perf_counter()
    tokens = max(sum(1 for _ in decoding), 1)  # an EOS first (drafting) decodes none: its time stands for one
    wall = time.perf_counter() - start
    after = session.engine_stats
    if probe is not None:
        probed = (probed, probe())
    timing = per_token_timing({key: after[key] - before[key] for key in after if key.endswith("seconds")}, tokens,
                              seconds=wall)
    seconds = wall / tokens
    hits, misses, copies = (sum(after[key]) - sum(before[key])
                            for key in ("expert_hits", "expert_misses", "expert_copies"))
    result = {"seconds_per_token": seconds, "tokens_per_second": 1.0 / seconds,
              **{f"{stage}_seconds": timing[stage] for stage in STAGES}, "host_other_seconds": timing["host"],
              "expert_hit_rate": hits / max(hits + misses, 1), "expert_copies_per_token": copies / tokens}
    if probe is not None:
        result["probe"] = probed
    if drafting:
        stats = session.stats
        result.update(tokens=tokens, acceptance_rate=stats.acceptance_rate, tokens_per_step=stats.tokens_per_step)
    return result


def run_modes(model: Any, modes: list[Mode], prompt_tokens: int, tokens: int, context: int | None, kv: KV,
              rng: np.random.Generator, kv_streaming: bool = False, defer_experts: int = 0,
              draft: str | None = None, draft_tokens: int | None = None,
              steering: Mapping[str, Any] | None = None,
              probe: Callable[[], Any] | None = None) -> dict[str, dict[str, Any]]:
    """decode() on a fresh session (Model.session) of each mode in turn, KV in format `kv`, streamed or not,
    `defer_experts` deferred, drafting with `draft`, steered by `steering` (Model.session's control_vectors and
    control_layers; one session in VRAM at a time), `probe` read around each mode's timed tokens."""
    g = model.info.geometry
    prompt = prompt_ids(g, prompt_tokens, rng)
    if context is None:
        context = min(g.context_length, prompt_tokens + tokens + 1)
    drafts = {} if draft is None else {"draft": draft, "draft_tokens": draft_tokens}
    results = {}
    for mode in modes:
        with model.session(context, kv=kv, mode=mode, kv_streaming=kv_streaming, defer_experts=defer_experts,
                           **drafts, **(steering or {})) as session:
            results[mode.value] = decode(session, prompt, tokens, probe)
    return results
