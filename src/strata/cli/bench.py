"""`strata bench [MODEL]`: greedy decode speed per session mode, where each token's time goes, and how close
that is to the machine's limit; then prompt processing at a few prompt lengths (the prompt path, its time to
first token and its streaming limit, beside stepping the same ids).

The limit of one token is the time to read what a token must read, at the rate this box reads it: the
routed experts it selects from host RAM (at the CPU pool's measured read bandwidth), the dense weights from
HBM (at the box's measured device copy rate), plus one doorbell round trip per layer (GPU -> host loop ->
GPU, measured on the box). With no MODEL, the default benchmark model is synthesized once into the user cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.cli.help import ShowDefaults
from strata.errors import InvalidArgument
from strata.options import DEFAULT_KV, KV, Mode, check_defer_experts

if TYPE_CHECKING:
    import numpy as np

    from strata.models import Geometry
    from strata.runtime.engine import GpuEngine

HBM_BYTES_PER_SECOND = 4.2e12  # the box's measured device-to-device copy rate (H200)
DOORBELL_SECONDS = 3.1e-6  # one doorbell round trip GPU -> host loop -> GPU, measured on the box
PCIE_BYTES_PER_SECOND = 55e9  # the box's pinned host -> device copy rate, measured
STEPPED_TOKENS = 64  # the token-by-token figure beside a prompt: its first ids, stepped
READ_BANDWIDTH_BYTES = 1 << 30  # buffer the pool's workers read to measure host read bandwidth
BENCH_ARCH, BENCH_PRESET, BENCH_LAYERS = "qwen4exp", "bench", 16

Tensors = Mapping[str, tuple[int, tuple[int, ...]]]  # name -> (ggml_type, ne)


@dataclass(frozen=True)
class Limit:
    """The machine's limit for one decoded token, and its parts."""

    routed_bytes: int  # routed expert weight bytes one token reads from host RAM (the experts not in VRAM)
    dense_bytes: int  # dense and cached expert weight bytes one token reads from HBM
    read_bandwidth: float  # host bytes/s, measured by the CPU pool's workers
    routed_seconds: float
    dense_seconds: float
    doorbell_seconds: float
    cached_bytes: int = 0  # of dense_bytes, the routed experts the VRAM cache holds

    @property
    def seconds(self) -> float:
        return self.routed_seconds + self.dense_seconds + self.doorbell_seconds


def machine_limit(g: Geometry, tensors: Tensors, read_bandwidth: float, slots: list[int] | None = None) -> Limit:
    """The limit for `g` whose tensors are {name: (ggml_type, ne)} at host read bandwidth `read_bandwidth`: a
    token reads n_expert_used of every layer's experts (each routed tensor holds all n_expert of one matrix),
    from HBM the share `slots[l]` / n_expert the VRAM cache holds (routing spread evenly over the experts, as
    the synthetic models' is) and from host RAM the rest, and every VRAM weight it reads whole (dense and
    elementwise; of the row-gathered embedding only its own row); a layer whose experts are all cached rings
    no doorbell."""
    from strata.models import Role
    from strata.runtime.expert_cache import expert_bytes
    from strata.runtime.plan import bytes_by_role

    if not read_bandwidth > 0:
        raise InvalidArgument(f"host read bandwidth must be > 0 bytes/s, got {read_bandwidth}")
    slots = slots or [0] * g.n_layer
    parts = bytes_by_role(g, tensors)
    per_expert = expert_bytes(g, tensors)
    cached = round(sum(b * g.n_expert_used * s / g.n_expert for b, s in zip(per_expert, slots)))
    routed = parts[Role.ROUTED_EXPERT] * g.n_expert_used // g.n_expert - cached
    dense = parts[Role.DENSE] + parts[Role.ELEMENTWISE] + cached
    ringing = sum(1 for s in slots if s < g.n_expert)
    return Limit(routed, dense, read_bandwidth, routed / read_bandwidth, dense / HBM_BYTES_PER_SECOND,
                 ringing * DOORBELL_SECONDS, cached)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$STRATA_CACHE, else $XDG_CACHE_HOME/strata, else ~/.cache/strata."""
    if environ.get("STRATA_CACHE"):
        return Path(environ["STRATA_CACHE"])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "strata"
    return Path.home() / ".cache" / "strata"


def bench_model(cache: Path, synthesize: Callable[..., Any], progress: Callable[[int, int], None] | None = None
                ) -> Path:
    """The default benchmark model in `cache`, synthesized there first if absent. It is written under a
    temporary name and renamed when complete, so an interrupted synth is never taken for the model."""
    path = cache / f"{BENCH_ARCH}-{BENCH_PRESET}-{BENCH_LAYERS}L.gguf"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    print(f"bench: synthesizing the default benchmark model into {path} (about 26 GB, once)", file=sys.stderr)
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        synthesize(partial, BENCH_ARCH, preset=BENCH_PRESET, n_layer=BENCH_LAYERS, progress=progress)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def prompt_ids(g: Geometry, n: int, rng: np.random.Generator) -> list[int]:
    """`n` random token ids, none of them the PLE's EOS (which would cut the n-gram context)."""
    if not g.ple_layers:
        return [int(t) for t in rng.integers(0, g.n_vocab, n)]
    ids = rng.integers(0, g.n_vocab - 1, n)  # one id fewer, then shifted past EOS
    return [int(t) + int(t >= g.ple_eos) for t in ids]


def decode(engine: GpuEngine, prompt: list[int], tokens: int) -> dict[str, float]:
    """Greedy decode of `tokens` after `prompt`; seconds per decoded token and its native breakdown."""
    from strata.runtime.engine import STAGES, per_token_timing
    from strata.sampling import SamplingParams

    greedy = SamplingParams()
    engine.reset()
    history = list(prompt)
    token = engine.feed(prompt, greedy, 0.0, history)
    before = engine.stats()
    start = time.perf_counter()
    for _ in range(tokens):
        history.append(token)
        token = engine.feed([token], greedy, 0.0, history)
    wall = time.perf_counter() - start
    after = engine.stats()
    timing = per_token_timing({key: after[key] - before[key] for key in after if key.endswith("seconds")}, tokens,
                              seconds=wall)
    seconds = wall / tokens
    hits, misses, copies = (sum(after[key]) - sum(before[key])
                            for key in ("expert_hits", "expert_misses", "expert_copies"))
    return {"seconds_per_token": seconds, "tokens_per_second": 1.0 / seconds,
            **{f"{stage}_seconds": timing[stage] for stage in STAGES}, "host_other_seconds": timing["host"],
            "expert_hit_rate": hits / max(hits + misses, 1), "expert_copies_per_token": copies / tokens}


def run_modes(model: Any, modes: list[Mode], prompt_tokens: int, tokens: int, context: int | None, kv: KV,
              rng: np.random.Generator, kv_streaming: bool = False,
              defer_experts: int = 0) -> dict[str, dict[str, float]]:
    """decode() on a fresh session of each mode in turn, KV in format `kv`, streamed or not, `defer_experts`
    deferred (one session in VRAM at a time)."""
    g = model.info.geometry
    prompt = prompt_ids(g, prompt_tokens, rng)
    if context is None:
        context = min(g.context_length, prompt_tokens + tokens + 1)
    results = {}
    for mode in modes:
        session = model.session(context, kv=kv, mode=mode, kv_streaming=kv_streaming, defer_experts=defer_experts)
        try:
            results[mode.value] = decode(session.engine, prompt, tokens)
        finally:
            session.engine.close()
    return results


def prompt_speed(model: Any, lengths: list[int], kv: KV, rng: np.random.Generator,
                 kv_streaming: bool = False) -> list[dict[str, float]]:
    """Per length n: n random ids through the prompt path (the feed samples the next token, so its time is the
    time to first token) and their first STEPPED_TOKENS stepped token by token, each from an empty sequence; the
    bytes the staging copied and their floor at PCIE_BYTES_PER_SECOND (the streaming limit)."""
    g = model.info.geometry
    context = min(g.context_length, max(lengths) + 1)
    chunked = model.session(context, kv=kv, snapshots=0, kv_streaming=kv_streaming).engine
    stepped = model.session(context, kv=kv, snapshots=0, prompt_chunk=0, kv_streaming=kv_streaming).engine
    greedy = (0.0, 0, 1.0, 0.0, 1.0)
    results = []
    try:
        if not chunked.native.prompt_chunk:
            raise InvalidArgument("this model has no prompt path (load it with prompt=True and room for the staging)")

        def feed(ids: list[int]) -> float:
            chunked.reset()
            rows = chunked.ple.rows_for(ids) if chunked.ple is not None else None
            start = time.perf_counter()
            chunked.native.feed(ids, rows, greedy, 0.0)  # every length takes the path, below the threshold too
            return time.perf_counter() - start

        feed(prompt_ids(g, min(STEPPED_TOKENS, context), rng))  # warm-up: kernels, graphs, the staging's first pages
        for n in lengths:
            ids = prompt_ids(g, n, rng)
            seconds = feed(ids)
            staged = chunked.stats()["prompt_staged_bytes"]  # reset() starts the sums over
            m = min(n, STEPPED_TOKENS)
            stepped.reset()
            start = time.perf_counter()
            stepped.prefill(ids[:m], ids[:m])
            stepped_rate = m / (time.perf_counter() - start)
            floor = staged / PCIE_BYTES_PER_SECOND
            results.append({"tokens": n, "chunk": chunked.native.prompt_chunk, "seconds": seconds,
                            "tokens_per_second": n / seconds, "staged_bytes": staged, "pcie_floor_seconds": floor,
                            "fraction_of_limit": floor / seconds, "stepped_tokens_per_second": stepped_rate})
    finally:
        chunked.close()
        stepped.close()
    return results


def prompt_report(rows: list[Mapping[str, float]]) -> list[str]:
    """The human-readable lines of prompt_speed's rows."""
    chunk = rows[0]["chunk"] if rows else 0
    lines = [f"{'prompt':>7s} {'tok/s':>8s} {'ttft s':>7s} {'staged GB':>9s} {'PCIe floor s':>12s} {'of limit':>8s} "
             f"{'stepped tok/s':>13s} {'speedup':>7s}   (prompt path, chunk {chunk})"]
    for r in rows:
        speedup = r["tokens_per_second"] / r["stepped_tokens_per_second"]
        lines.append(f"{r['tokens']:7d} {r['tokens_per_second']:8.0f} {r['seconds']:7.3f} "
                     f"{r['staged_bytes'] / 1e9:9.2f} {r['pcie_floor_seconds']:12.3f} {r['fraction_of_limit']:8.1%} "
                     f"{r['stepped_tokens_per_second']:13.1f} {speedup:6.1f}x")
    return lines


def report(result: Mapping[str, Any]) -> list[str]:
    """The human-readable lines of a bench result (see `run`)."""
    limit = result["limit"]
    limit_s = limit["seconds"]
    ms = 1e3
    lines = [f"model {result['model']}: {result['arch']}, {result['n_layer']} layers; prompt {result['prompt_tokens']} "
             f"tokens, {result['tokens']} decoded greedily; kv {result['kv']}"
             f"{' streamed' if result.get('kv_streaming') else ''}; defer experts {result.get('defer_experts', 0)}",
             f"machine limit {1 / limit_s:8.1f} tok/s = {limit_s * ms:.3f} ms/token:",
             f"  routed experts  {limit['routed_bytes'] / 1e9:7.3f} GB/token at host read "
             f"{limit['read_bandwidth'] / 1e9:.1f} GB/s (CPU pool, measured) = {limit['routed_seconds'] * ms:.3f} ms",
             f"  dense weights   {limit['dense_bytes'] / 1e9:7.3f} GB/token at HBM {HBM_BYTES_PER_SECOND / 1e12:.1f} "
             f"TB/s (the box's measured device copy) = {limit['dense_seconds'] * ms:.3f} ms",
             f"  doorbells       {limit['doorbell_seconds'] / DOORBELL_SECONDS:.0f} ringing layers x "
             f"{DOORBELL_SECONDS * 1e6:.1f} us (round trip measured on the box) = {limit['doorbell_seconds'] * ms:.3f} ms",
             f"  {result['expert_cache']} (of the dense bytes, {limit['cached_bytes'] / 1e9:.3f} GB/token)",
             f"{'mode':13s} {'tok/s':>8s} {'ms/tok':>8s} {'ring wait':>10s} {'pool':>8s} {'gpu pre':>8s} "
             f"{'gpu post':>8s} {'host/other':>10s} {'of limit':>8s} {'hits':>6s}"]
    for mode, m in result["modes"].items():
        lines.append(f"{mode:13s} {m['tokens_per_second']:8.2f} {m['seconds_per_token'] * ms:8.3f} "
                     f"{m['ring_wait_seconds'] * ms:10.3f} {m['pool_seconds'] * ms:8.3f} "
                     f"{m['gpu_pre_seconds'] * ms:8.3f} {m['gpu_post_seconds'] * ms:8.3f} "
                     f"{m['host_other_seconds'] * ms:10.3f} {m['fraction_of_limit']:8.1%} {m['expert_hit_rate']:6.1%}")
    lines.append("(breakdown columns in ms per token; gpu pre/post only in mode uncaptured)")
    return lines


def run(model: Any, *, model_path: str, modes: list[Mode | str], prompt_tokens: int, tokens: int,
        context: int | None = None, kv: KV | str = DEFAULT_KV, json_path: str | None = None,
        prompt_lengths: tuple[int, ...] = (), kv_streaming: bool = False, defer_experts: int = 0) -> dict[str, Any]:
    """Bench a loaded model: prints the report, returns (and with `json_path` writes) the numbers; with
    `prompt_lengths`, the prompt path's speed at each length too (prompt_speed, exact: deferral is decode-only)."""
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
    check_defer_experts(defer_experts, g.n_expert_used)  # before the bandwidth measurement
    tensors = file_tensors(model.file)
    limit = machine_limit(g, tensors, model.pool.read_bandwidth(READ_BANDWIDTH_BYTES), model.cache_slots)
    results = run_modes(model, modes, prompt_tokens, tokens, context, kv, np.random.default_rng(), kv_streaming,
                        defer_experts)
    for m in results.values():
        m["fraction_of_limit"] = limit.seconds / m["seconds_per_token"]
    result = {"model": model_path, "arch": g.arch, "n_layer": g.n_layer, "prompt_tokens": prompt_tokens,
              "tokens": tokens, "kv": kv.value, "kv_streaming": kv_streaming, "defer_experts": defer_experts,
              "expert_cache": describe(g, tensors, model.cache_slots, model.cache_bytes), "cache_slots": model.cache_slots,
              "limit": {**asdict(limit), "seconds": limit.seconds}, "modes": results}
    print("\n".join(report(result)))
    if prompt_lengths:
        result["prompt"] = prompt_speed(model, list(prompt_lengths), kv, np.random.default_rng(), kv_streaming)
        print("\n".join(prompt_report(result["prompt"])))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    return result


def cache_sweep(model: Any, shares: list[float], policy: str = "lfru", **options: Any) -> list[dict[str, Any]]:
    """run() with the expert cache holding each share (0..1) of every layer's experts in turn (the lowest ids
    at first, replaced by `policy`; `model` loaded without a cache), one cache in VRAM at a time; a summary line
    per share."""
    from strata.runtime import expert_cache

    g = model.info.geometry
    sizes = expert_cache.expert_bytes(g, file_tensors_of(model))
    results = []
    for share in shares:
        if not 0.0 <= share <= 1.0:
            raise InvalidArgument(f"a cache share must be in 0..100 %, got {share * 100:g}")
        model.cache = None  # the previous share's VRAM is free before the next is filled
        slots = [round(share * g.n_expert)] * g.n_layer
        model.cache = expert_cache.build(model.pool, slots, model.device, sizes, policy=policy)
        model.cache_slots = slots
        results.append({"share": share, **run(model, **options)})
    model.cache, model.cache_slots = None, [0] * g.n_layer
    print(f"{'cached':>7s} {'slots':>6s} {'mode':13s} {'tok/s':>8s} {'hits':>6s} {'copies':>7s} {'limit tok/s':>11s} "
          f"{'of limit':>8s}   (policy {policy})")
    for r in results:
        for mode, m in r["modes"].items():
            print(f"{r['share']:7.0%} {r['cache_slots'][0]:6d} {mode:13s} {m['tokens_per_second']:8.2f} "
                  f"{m['expert_hit_rate']:6.1%} {m['expert_copies_per_token']:7.2f} {1 / r['limit']['seconds']:11.1f} "
                  f"{m['fraction_of_limit']:8.1%}")
    return results


def file_tensors_of(model: Any) -> Tensors:
    from strata.runtime.plan import file_tensors

    return file_tensors(model.file)


def register(commands) -> None:
    from strata.cli.session import add_deferral_argument, add_placement_arguments

    sub = commands.add_parser(
        "bench", help="decode speed of the GPU engine vs this machine's limit (`bench pool`: the CPU pool alone)",
        description="Greedy decode speed per session mode, its per-token breakdown and the machine's limit. "
                    "With no MODEL the default benchmark model (qwen4exp, 16 layers, about 26 GB) is synthesized "
                    "once into the user cache. `strata bench pool --help`: the CPU expert pool benchmark.",
        formatter_class=ShowDefaults)
    sub.add_argument("model", nargs="?", default=None, metavar="MODEL",
                     help="a .gguf file (default: the synthesized benchmark model)")
    sub.add_argument("--tokens", type=int, default=128, help="tokens decoded per mode (default 128)")
    sub.add_argument("--prompt-tokens", type=int, default=16, help="random prompt tokens first (default 16)")
    sub.add_argument("--mode", choices=[*Mode.values(), "all"], default="all", help="session mode(s) to measure")
    sub.add_argument("--context", type=int, default=None, help="session context (default: prompt + tokens)")
    sub.add_argument("--kv", choices=KV.values(), default=DEFAULT_KV.value, help="KV cache format")
    sub.add_argument("--kv-streaming", action="store_true",
                     help="the attention KV in page-locked host memory, a VRAM window of what QSA selects")
    add_deferral_argument(sub)
    sub.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    sub.add_argument("--prompt-lengths", default="512,4096", metavar="TOKENS",
                     help="prompt path speed at these prompt lengths, beside stepping them (0: none)")
    add_placement_arguments(sub)
    sub.add_argument("--cache-shares", default=None, metavar="PERCENTS",
                     help="sweep the expert cache over these shares of every layer's routed experts, e.g. "
                          "0,25,50,75,100 (the model loads without a cache; each share is filled in turn)")
    sub.set_defaults(handler=handle)


def handle(args) -> int:
    from strata.cli.session import placement, require_gpu

    require_gpu("strata bench measures the GPU engine; `strata bench pool` measures the CPU expert pool alone")
    path = args.model
    if path is None:
        from strata.progress import ByteProgress
        from strata.synth import synthesize

        path = bench_model(cache_dir(), synthesize, ByteProgress("bench: synth"))
    from strata.runtime.model import load

    modes = list(Mode) if args.mode == "all" else [Mode.parse(args.mode)]
    try:
        lengths = tuple(int(n) for n in args.prompt_lengths.split(",") if int(n) != 0)
    except ValueError:
        raise InvalidArgument(f"--prompt-lengths takes token counts such as 512,4096, "
                              f"got {args.prompt_lengths!r}") from None
    options = {"model_path": str(path), "modes": modes, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
               "context": args.context, "kv": args.kv, "prompt_lengths": lengths, "kv_streaming": args.kv_streaming,
               "defer_experts": args.defer_experts}
    if args.cache_shares is None:
        with load(str(path), **placement(args)) as model:
            run(model, **options, json_path=args.json)
        return 0
    try:
        shares = [float(p) / 100 for p in args.cache_shares.split(",")]
    except ValueError:
        raise InvalidArgument(f"--cache-shares takes percentages such as 0,50,100, got {args.cache_shares!r}") from None
    with load(str(path), **{**placement(args), "expert_cache": 0}) as model:
        results = cache_sweep(model, shares, args.cache_policy, **options)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
