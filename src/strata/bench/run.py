"""A loaded model's bench: the machine's rates and limit, decode per session mode, the prompt path at a few
lengths; and the same over a sweep of expert cache shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from strata.bench.decode import run_modes
from strata.bench.limit import machine_limit
from strata.bench.prompt import prompt_report, prompt_speed
from strata.bench.rates import Rates, measure
from strata.bench.tiers import disk_rate, expert_spans, tier_counts, tiered_limit
from strata.bench.records import Emit, write_json
from strata.bench.report import report, sweep_report
from strata.errors import InvalidArgument
from strata.generation.drafts import named_drafter
from strata.options import DEFAULT_KV, KV, Mode, check_defer_experts


def run(model: Any, *, model_path: str, modes: list[Mode | str], prompt_tokens: int, tokens: int, emit: Emit,
        context: int | None = None, kv: KV | str = DEFAULT_KV, json_path: str | None = None,
        prompt_lengths: tuple[int, ...] = (), kv_streaming: bool = False, defer_experts: int = 0,
        draft: str | None = None, draft_tokens: int | None = None, rates: Rates | None = None,
        control_vectors: Sequence[tuple[str, float]] = (), control_layers: tuple[int, int] | None = None
        ) -> dict[str, Any]:
    """Bench a loaded model (strata.load's): emits the report, returns (and with `json_path` writes) the numbers;
    with `prompt_lengths`, the prompt path's speed at each length too (prompt_speed, exact: deferral is
    decode-only). With `draft`, decoding verifies that drafter's tokens (Model.session's draft, draft_tokens).
    Every session steers with `control_vectors` on `control_layers` (Model.session's; docs/control_vectors.md).
    `rates`: the machine's, measured here when None (rates.measure)."""
    import numpy as np

    from strata.runtime.expert_cache import describe
    from strata.runtime.plan import file_tensors

    if not modes:
        raise InvalidArgument(f"no session mode to bench; choose from {', '.join(Mode.values())} or all")
    modes = [Mode.parse(mode) for mode in modes]
    kv = KV.parse(kv)
    if prompt_tokens < 1 or tokens < 1:
        raise InvalidArgument(f"--prompt-tokens and --tokens must be >= 1, got {prompt_tokens} and {tokens}")
    if any(n < 1 for n in prompt_lengths):
        raise InvalidArgument(f"--prompt-lengths must be >= 1 token each, got {list(prompt_lengths)}")
    g = model.info.geometry
    check_defer_experts(defer_experts, g.n_expert_used)  # before the rates are measured
    if draft is not None:
        named_drafter(draft, draft_tokens)
    rates = rates or measure(model.pool, model.device)
    tensors = file_tensors(model.file)
    limit = machine_limit(g, tensors, rates, model.cache_slots)
    # A tiered load (docs/tiers.md) reads the experts its arena lacks from the file: its limit adds them at the
    # file's read rate, measured here with the tier's own kind of reads, per mode from the tier's counters.
    tiered = getattr(model, "ram", None) is not None and model.ram.tiered
    disk = disk_rate(str(model.file.path), expert_spans(model.file), seconds=2.0) if tiered else None
    # Model.session's steering, only where some is given: a bench without it opens its sessions as it always did
    steering = {"control_vectors": list(control_vectors), "control_layers": control_layers} \
        if control_vectors or control_layers is not None else {}
    results = {}
    for mode in modes:
        # the tier's counts over the timed tokens only: the prompt's chunk reads the union of its rows' experts
        results.update(run_modes(model, [mode], prompt_tokens, tokens, context, kv, np.random.default_rng(),
                                 kv_streaming, defer_experts, draft, draft_tokens, steering,
                                 probe=(lambda: tier_counts(model.pool)) if tiered else None))
        m = results[mode.value]
        if tiered:
            m["tier"] = tiered_limit(limit, *m.pop("probe"), m.get("tokens", tokens), disk)
        m["fraction_of_limit"] = m["tier"]["seconds"] / m["seconds_per_token"] if tiered else \
            limit.seconds / m["seconds_per_token"]
    result = {"model": model_path, "arch": g.arch, "n_layer": g.n_layer, "prompt_tokens": prompt_tokens,
              "tokens": tokens, "kv": kv.value, "kv_streaming": kv_streaming, "defer_experts": defer_experts,
              "draft": draft, "draft_tokens": draft_tokens if draft else None,
              "control_vectors": [[str(path), float(scale)] for path, scale in control_vectors],
              "control_layers": list(control_layers) if control_layers is not None else None,
              "expert_cache": describe(g, tensors, model.cache_slots, model.cache_bytes),
              "cache_slots": model.cache_slots,
              "rates": asdict(rates), "limit": {**asdict(limit), "seconds": limit.seconds}, "modes": results}
    for line in report(result):
        emit(line)
    if prompt_lengths:
        result["prompt"] = prompt_speed(model, list(prompt_lengths), kv, np.random.default_rng(), rates.pcie_upload,
                                        kv_streaming, steering)
        for line in prompt_report(result["prompt"]):
            emit(line)
    if json_path:
        write_json(json_path, result)
    return result


def cache_sweep(model: Any, shares: list[float], policy: str = "lfru", *, emit: Emit, rates: Rates | None = None,
                **options: Any) -> list[dict[str, Any]]:
    """run() with the expert cache holding each share (0..1) of every layer's experts in turn (the lowest ids
    at first, replaced by `policy`; `model` loaded without a cache), one cache in VRAM at a time, the `rates`
    measured once (when None); a summary line per share and mode."""
    from strata.runtime import expert_cache
    from strata.runtime.plan import file_tensors

    for share in shares:  # all of them before the first run
        if not 0.0 <= share <= 1.0:
            raise InvalidArgument(f"a cache share must be in 0..100 %, got {share * 100:g}")
    g = model.info.geometry
    sizes = expert_cache.expert_bytes(g, file_tensors(model.file))
    rates = rates or measure(model.pool, model.device)
    results = []
    for share in shares:
        model.cache = None  # the previous share's VRAM is free before the next is filled
        slots = [round(share * g.n_expert)] * g.n_layer
        model.cache = expert_cache.build(model.pool, slots, model.device, sizes, policy=policy)
        model.cache_slots = slots
        results.append({"share": share, **run(model, **options, emit=emit, rates=rates)})
    model.cache, model.cache_slots = None, [0] * g.n_layer
    for line in sweep_report(results, policy):
        emit(line)
    return results
