"""`strata bench [MODEL]`: greedy decode speed per session mode, where each token's time goes, and how close
that is to the machine's limit.

The limit of one token is the time to read what a token must read, at the rate this box reads it: the
routed experts it selects from host RAM (at the CPU pool's measured read bandwidth), the dense weights from
HBM (at the box's measured device copy rate), plus one doorbell round trip per layer (GPU -> host loop ->
GPU, measured on the box). With no MODEL, the default benchmark model is synthesized once into the user cache.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.engine import MODES, GpuEngine, open_session
from strata.errors import InvalidArgument
from strata.models import Geometry
from strata.plan import file_tensors, is_ngram_table, is_routed_expert, tensor_bytes
from strata.sampling import SamplingParams

HBM_BYTES_PER_SECOND = 4.2e12  # the box's measured device-to-device copy rate (H200)
DOORBELL_SECONDS = 3.1e-6  # one doorbell round trip GPU -> host loop -> GPU, measured on the box
READ_BANDWIDTH_BYTES = 1 << 30  # buffer the pool's workers read to measure host read bandwidth
BENCH_ARCH, BENCH_PRESET, BENCH_LAYERS = "qwen4exp", "bench", 16
GREEDY = SamplingParams()
# Read by every token at most once per row, not whole: the token embedding (one row per token).
GATHERED = ("token_embd.weight",)

Tensors = Mapping[str, tuple[int, tuple[int, ...]]]  # name -> (ggml_type, ne)


@dataclass(frozen=True)
class Limit:
    """The machine's limit for one decoded token, and its parts."""

    routed_bytes: int  # routed expert weight bytes one token reads (n_expert_used experts per layer)
    dense_bytes: int  # dense weight bytes one token reads from HBM
    read_bandwidth: float  # host bytes/s, measured by the CPU pool's workers
    routed_seconds: float
    dense_seconds: float
    doorbell_seconds: float

    @property
    def seconds(self) -> float:
        return self.routed_seconds + self.dense_seconds + self.doorbell_seconds


def routed_bytes_per_token(g: Geometry, tensors: Tensors) -> int:
    """Sum over layers of n_expert_used experts' gate + up + down bytes in their canonical forms."""
    total = 0
    for name, (ggml_type, ne) in tensors.items():
        if is_routed_expert(name):  # ne = {cols, rows, n_expert}: all experts of one matrix of one layer
            total += tensor_bytes(ggml_type, ne) * g.n_expert_used // g.n_expert
    return total


def dense_bytes_per_token(tensors: Tensors) -> int:
    """Bytes of the VRAM-resident weights a token reads whole (all but the routed experts, the n-gram table
    and the row-gathered token embedding)."""
    return sum(tensor_bytes(ggml_type, ne) for name, (ggml_type, ne) in tensors.items()
               if not (is_routed_expert(name) or is_ngram_table(name) or name in GATHERED))


def machine_limit(g: Geometry, tensors: Tensors, read_bandwidth: float) -> Limit:
    """The limit for `g` whose tensors are {name: (ggml_type, ne)} at host read bandwidth `read_bandwidth`."""
    if not read_bandwidth > 0:
        raise InvalidArgument(f"host read bandwidth must be > 0 bytes/s, got {read_bandwidth}")
    routed, dense = routed_bytes_per_token(g, tensors), dense_bytes_per_token(tensors)
    return Limit(routed, dense, read_bandwidth, routed / read_bandwidth, dense / HBM_BYTES_PER_SECOND,
                 g.n_layer * DOORBELL_SECONDS)


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
    engine.reset()
    history = list(prompt)
    token = engine.feed(prompt, GREEDY, 0.0, history)
    before = engine.stats()
    start = time.perf_counter()
    for _ in range(tokens):
        history.append(token)
        token = engine.feed([token], GREEDY, 0.0, history)
    wall = time.perf_counter() - start
    after = engine.stats()
    per = {key: (after[key] - before[key]) / tokens for key in
           ("ring_wait_seconds", "pool_seconds", "gpu_pre_seconds", "gpu_post_seconds")}
    seconds = wall / tokens
    return {"seconds_per_token": seconds, "tokens_per_second": 1.0 / seconds, **per,
            "host_other_seconds": seconds - sum(per.values())}


def run_modes(model: Any, modes: list[str], prompt_tokens: int, tokens: int, context: int | None,
              rng: np.random.Generator) -> dict[str, dict[str, float]]:
    """decode() on a fresh session of each mode in turn (one session in VRAM at a time)."""
    g = model.info.geometry
    prompt = prompt_ids(g, prompt_tokens, rng)
    if context is None:
        context = min(g.context_length, prompt_tokens + tokens + 1)
    results = {}
    for mode in modes:
        session = open_session(model, context, mode=mode)
        try:
            results[mode] = decode(session.engine, prompt, tokens)
        finally:
            session.engine.close()
    return results


def report(result: Mapping[str, Any]) -> list[str]:
    """The human-readable lines of a bench result (see `run`)."""
    limit = result["limit"]
    limit_s = limit["seconds"]
    ms = 1e3
    lines = [f"model {result['model']}: {result['arch']}, {result['n_layer']} layers; prompt {result['prompt_tokens']} "
             f"tokens, {result['tokens']} decoded greedily",
             f"machine limit {1 / limit_s:8.1f} tok/s = {limit_s * ms:.3f} ms/token:",
             f"  routed experts  {limit['routed_bytes'] / 1e9:7.3f} GB/token at host read "
             f"{limit['read_bandwidth'] / 1e9:.1f} GB/s (CPU pool, measured) = {limit['routed_seconds'] * ms:.3f} ms",
             f"  dense weights   {limit['dense_bytes'] / 1e9:7.3f} GB/token at HBM {HBM_BYTES_PER_SECOND / 1e12:.1f} "
             f"TB/s (the box's measured device copy) = {limit['dense_seconds'] * ms:.3f} ms",
             f"  doorbells       {result['n_layer']} x {DOORBELL_SECONDS * 1e6:.1f} us (round trip measured on the "
             f"box) = {limit['doorbell_seconds'] * ms:.3f} ms",
             f"{'mode':13s} {'tok/s':>8s} {'ms/tok':>8s} {'ring wait':>10s} {'pool':>8s} {'gpu pre':>8s} "
             f"{'gpu post':>8s} {'host/other':>10s} {'of limit':>8s}"]
    for mode, m in result["modes"].items():
        lines.append(f"{mode:13s} {m['tokens_per_second']:8.2f} {m['seconds_per_token'] * ms:8.3f} "
                     f"{m['ring_wait_seconds'] * ms:10.3f} {m['pool_seconds'] * ms:8.3f} "
                     f"{m['gpu_pre_seconds'] * ms:8.3f} {m['gpu_post_seconds'] * ms:8.3f} "
                     f"{m['host_other_seconds'] * ms:10.3f} {m['fraction_of_limit']:8.1%}")
    lines.append("(breakdown columns in ms per token; gpu pre/post only in mode uncaptured)")
    return lines


def run(model: Any, *, model_path: str, modes: list[str], prompt_tokens: int, tokens: int,
        context: int | None = None, json_path: str | None = None) -> dict[str, Any]:
    """Bench a loaded model: prints the report, returns (and with `json_path` writes) the numbers."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise InvalidArgument(f"unknown session mode(s) {unknown}; choose from {', '.join(MODES)} or all")
    if prompt_tokens < 1 or tokens < 1:
        raise InvalidArgument(f"--prompt-tokens and --tokens must be >= 1, got {prompt_tokens} and {tokens}")
    g = model.info.geometry
    tensors = file_tensors(model.file)
    limit = machine_limit(g, tensors, model.pool.read_bandwidth(READ_BANDWIDTH_BYTES))
    results = run_modes(model, modes, prompt_tokens, tokens, context, np.random.default_rng())
    for m in results.values():
        m["fraction_of_limit"] = limit.seconds / m["seconds_per_token"]
    result = {"model": model_path, "arch": g.arch, "n_layer": g.n_layer, "prompt_tokens": prompt_tokens,
              "tokens": tokens, "limit": {**asdict(limit), "seconds": limit.seconds}, "modes": results}
    print("\n".join(report(result)))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    return result
