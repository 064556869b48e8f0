"""The human-readable lines of a model bench (strata.bench.run) and of its expert cache sweep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MS = 1e3


def report(result: Mapping[str, Any]) -> list[str]:
    """The lines of a bench result (see strata.bench.run.run)."""
    limit = result["limit"]
    limit_s = limit["seconds"]
    lines = [f"model {result['model']}: {result['arch']}, {result['n_layer']} layers; prompt {result['prompt_tokens']} "
             f"tokens, {result['tokens']} decoded greedily; kv {result['kv']}"
             f"{' streamed' if result.get('kv_streaming') else ''}; defer experts {result.get('defer_experts', 0)}"
             f"{drafting(result)}",
             f"machine limit {1 / limit_s:8.1f} tok/s = {limit_s * MS:.3f} ms/token:",
             f"  routed experts  {limit['routed_bytes'] / 1e9:7.3f} GB/token at host read "
             f"{limit['read_bandwidth'] / 1e9:.1f} GB/s (CPU pool, measured here) = "
             f"{limit['routed_seconds'] * MS:.3f} ms",
             f"  dense weights   {limit['dense_bytes'] / 1e9:7.3f} GB/token at HBM "
             f"{limit['hbm_copy_rate'] / 1e12:.1f} TB/s (measured device copy, measured here) = "
             f"{limit['dense_seconds'] * MS:.3f} ms",
             f"  doorbells       {limit['ringing_layers']} ringing layers x "
             f"{limit['doorbell_round_trip'] * 1e6:.1f} us (round trip measured here) = "
             f"{limit['doorbell_seconds'] * MS:.3f} ms",
             f"  {result['expert_cache']} (of the dense bytes, {limit['cached_bytes'] / 1e9:.3f} GB/token)",
             f"{'mode':13s} {'tok/s':>8s} {'ms/tok':>8s} {'ring wait':>10s} {'pool':>8s} {'gpu pre':>8s} "
             f"{'gpu post':>8s} {'host/other':>10s} {'of limit':>8s} {'hits':>6s}"]
    for mode, m in result["modes"].items():
        lines.append(f"{mode:13s} {m['tokens_per_second']:8.2f} {m['seconds_per_token'] * MS:8.3f} "
                     f"{m['ring_wait_seconds'] * MS:10.3f} {m['pool_seconds'] * MS:8.3f} "
                     f"{m['gpu_pre_seconds'] * MS:8.3f} {m['gpu_post_seconds'] * MS:8.3f} "
                     f"{m['host_other_seconds'] * MS:10.3f} {m['fraction_of_limit']:8.1%} {m['expert_hit_rate']:6.1%}")
    lines.append("(breakdown columns in ms per token; gpu pre/post only in mode uncaptured)")
    if result.get("draft"):
        lines += [f"{mode:13s} {m['tokens']} tokens decoded, drafts accepted {m['acceptance_rate']:.1%}, "
                  f"{m['tokens_per_step']:.2f} tokens per step" for mode, m in result["modes"].items()]
    for mode, m in result["modes"].items():
        lines += bound_lines(mode, m, limit)
        if "tier" in m:
            lines.append(tier_line(mode, m["tier"]))
    return lines


def tier_line(mode: str, tier: Mapping[str, Any]) -> str:
    """A tiered load's mode: the experts its pool read from the file, at the file's read rate, and the limit then."""
    return (f"  {mode}: the file {tier['misses_per_token']:.1f} experts a token missed ({tier['missed_share']:.1%} of "
            f"the pool's), {tier['disk_bytes_per_token'] / 1e6:.1f} MB at {tier['disk_rate'] / 1e9:.2f} GB/s "
            f"({tier['disk_reads']}, measured here) = {tier['disk_seconds'] * MS:.3f} ms; the tiered limit "
            f"{1 / tier['seconds']:.1f} tok/s = {tier['seconds'] * MS:.3f} ms/token")


def drafting(result: Mapping[str, Any]) -> str:
    """The header's drafting part: the drafter and its most drafts per step, where the bench drafted."""
    return f"; draft {result['draft']}, up to {result['draft_tokens']} per step" if result.get("draft") else ""


def bound_lines(mode: str, m: Mapping[str, float], limit: Mapping[str, Any]) -> list[str]:
    """Each term of a mode's token beside the bound the machine sets it (ms per token): the GPU's work before the
    rings beside the dense bytes at the HBM rate (per ringing layer too), the pool beside the routed bytes at the
    read rate, the host and the rest beside the doorbells' round trips, the token beside the limit. With no layer
    ringing (every routed expert in VRAM) the whole token is the GPU's: it stands beside the dense bytes."""
    ringing = limit["ringing_layers"]

    def term(name: str, seconds: float, bound: float, of: str) -> str:
        share = f"{bound / seconds:6.1%} of it" if seconds > 0 else ""
        return f"  {name:22s} {seconds * MS:8.3f} ms   bound {bound * MS:7.3f} ms ({of}) {share}"

    lines = [f"{mode}: each term beside its bound"]
    if ringing:
        per_layer = m["ring_wait_seconds"] / ringing * 1e6
        lines += [term("gpu before the rings", m["ring_wait_seconds"], limit["dense_seconds"],
                       "dense bytes at HBM") + f"; {per_layer:.1f} us per ringing layer",
                  term("pool", m["pool_seconds"], limit["routed_seconds"], "routed bytes at host read"),
                  term("host and other", m["host_other_seconds"], limit["doorbell_seconds"], "doorbell round trips")]
    else:
        lines.append(term("gpu, the whole token", m["seconds_per_token"], limit["dense_seconds"],
                          "dense and cached bytes at HBM"))
    lines.append(term("token", m["seconds_per_token"], limit["seconds"], "the limit"))
    return lines


def sweep_report(results: list[Mapping[str, Any]], policy: str) -> list[str]:
    """The summary lines of an expert cache sweep (see strata.bench.run.cache_sweep): a line per share and mode."""
    lines = [f"{'cached':>7s} {'slots':>6s} {'mode':13s} {'tok/s':>8s} {'hits':>6s} {'copies':>7s} "
             f"{'limit tok/s':>11s} {'of limit':>8s}   (policy {policy})"]
    for r in results:
        for mode, m in r["modes"].items():
            lines.append(f"{r['share']:7.0%} {r['cache_slots'][0]:6d} {mode:13s} {m['tokens_per_second']:8.2f} "
                         f"{m['expert_hit_rate']:6.1%} {m['expert_copies_per_token']:7.2f} "
                         f"{1 / r['limit']['seconds']:11.1f} {m['fraction_of_limit']:8.1%}")
    return lines
