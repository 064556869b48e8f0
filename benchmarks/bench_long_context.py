"""Decode speed as the context grows, per KV format, with and without KV streaming (docs/performance.md, "Long
contexts").

    python3 benchmarks/bench_long_context.py [MODEL.gguf] [--depths 4096,262144] [--kv int8] [--stream off,on]
        [--tokens 64] [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache). The defaults take about
two minutes on the GPU box; docs/performance.md's table ran `--kv q4,k8v4,bf16,int8 --depths
4096,32768,131072,262144`.

One session per (format, streaming) of the largest depth's context: the context is built through the prompt path
(timed, in feeds of FEED_TOKENS random ids), then `tokens` tokens are decoded greedily at each depth in turn, so a
depth's row is the decode that ends at that position. Every routed expert stays on the CPU pool (expert_cache=0).
Each row: decode tok/s and its per-token breakdown, the seconds and rate of building the context up to it, the
session's VRAM by part (the memory plan's figures) and, when streaming, the KV bytes the window fetched over PCIe
per decoded token.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import strata
from strata.bench.decode import prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.runtime.engine import per_token_timing
from strata.sampling import SamplingParams

FEED_TOKENS = 32768  # ids per feed while building a context: bounds the PLE rows gathered on the host at once
MIB = 1 << 20


def build(engine, g, history: list[int], upto: int, rng: np.random.Generator) -> float:
    """Feeds random ids until the session holds `upto` tokens; returns the seconds it took."""
    start = time.perf_counter()
    while len(history) < upto:
        ids = prompt_ids(g, min(FEED_TOKENS, upto - len(history)), rng)
        history.extend(ids)
        engine.prefill(ids, history)
    return time.perf_counter() - start


def decode(engine, history: list[int], tokens: int) -> dict[str, float]:
    """`tokens` greedy steps from the session's position, the first fed a fixed id; per-token figures."""
    greedy = SamplingParams()
    before = engine.stats()
    start = time.perf_counter()
    token = 1
    for _ in range(tokens):
        history.append(token)
        token = engine.feed([token], greedy, 0.0, history)
    wall = time.perf_counter() - start
    after = engine.stats()
    delta = {key: after[key] - before[key] for key in after if key.endswith("seconds") or key.endswith("bytes")}
    timing = per_token_timing(delta, tokens, seconds=wall)
    return {"tokens_per_second": tokens / wall, "ms_per_token": 1e3 * wall / tokens,
            **{f"{stage}_ms": 1e3 * value for stage, value in timing.items()},
            "kv_fetched_bytes_per_token": delta.get("kv_stream_bytes", 0) / tokens}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--depths", default="4096,262144")
    parser.add_argument("--kv", default="int8")
    parser.add_argument("--stream", default="off,on")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json")
    args = parser.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    if args.model is None:
        from strata.synth import synthesize

        args.model = str(bench_model(cache_dir(), synthesize))
    rows = []
    with strata.load(args.model, expert_cache=0, progress=False) as model:
        g = model.info.geometry
        for kv in args.kv.split(","):
            for stream in args.stream.split(","):
                context = min(depths[-1], g.context_length)
                session = model.session(context, kv=kv, snapshots=0, kv_streaming=stream == "on")
                engine = session.engine
                vram = session_vram(model, context, kv, stream == "on", engine.prompt_chunk)
                rng = np.random.default_rng(0)
                history: list[int] = []
                built = 0.0
                try:
                    for depth in depths:
                        depth = min(depth, context)
                        target = depth - args.tokens
                        before = len(history)
                        seconds = build(engine, g, history, target, rng)
                        built += seconds
                        row = {"kv": kv, "stream": stream, "depth": depth, "build_seconds": built,
                               "build_tokens_per_second": (target - before) / max(seconds, 1e-9),
                               **decode(engine, history, args.tokens), "vram_bytes": vram}
                        rows.append(row)
                        print(f"kv {kv:5s} stream {stream:3s} depth {depth:7d}: {row['tokens_per_second']:7.2f} tok/s "
                              f"{row['ms_per_token']:7.3f} ms/tok (ring wait {row['ring_wait_ms']:.3f}, pool "
                              f"{row['pool_ms']:.3f}, host {row['host_ms']:.3f}); built in {built:7.1f} s "
                              f"({row['build_tokens_per_second']:7.0f} tok/s); KV fetched "
                              f"{row['kv_fetched_bytes_per_token'] / MIB:6.2f} MiB/token", flush=True)
                finally:
                    engine.close()
                print("  VRAM " + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in vram.items()), flush=True)
                first = next(r for r in rows if r["kv"] == kv and r["stream"] == stream)
                print(f"RESULT long context kv {kv} streaming {stream}: {row['tokens_per_second']:.1f} tok/s at "
                      f"{row['depth']} tokens = {row['tokens_per_second'] / first['tokens_per_second']:.0%} of "
                      f"{first['depth']}; built in {row['build_seconds']:.1f} s", flush=True)
                if args.json:  # after every session: a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump(rows, f, indent=1)


def session_vram(model, context: int, kv: str, streaming: bool, chunk: int) -> dict[str, int]:
    """The session's parts of the memory plan: VRAM beside the model's weights, and (streaming) the host copy."""
    from strata.runtime.plan import file_tensors, memory_plan

    plan = memory_plan(model.info.geometry, file_tensors(model.file), context, kv, snapshots=0, prompt_chunk=chunk,
                       kv_streaming=streaming)
    host = {f"host: {name}": nbytes for name, nbytes in plan.host.items() if name.startswith(("KV", "QSA"))}
    return {**{name: nbytes for name, nbytes in plan.vram.items() if name != "dense weights"}, **host}


if __name__ == "__main__":
    main()
