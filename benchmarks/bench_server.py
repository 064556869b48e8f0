"""`strata serve` under load: time to first token and tokens/s seen by openai clients, against the same model's
Session called directly in the same run (what the server costs), on the GPU engine.

C clients (asyncio tasks in a process of their own) each send R streamed chat requests, one after another, to a
server with S sessions and Q queue places
(all at once: batch 1, so the queue wait is most of a loaded request's time to first token). Every request must
come back whole (its usage counts max_tokens tokens) or be refused 429.
    python3 benchmarks/bench_server.py [--model PATH] [--clients 32] [--requests 4] [--max-tokens 16] [--json PATH]
Without --model the default benchmark model (strata bench's) is synthesized once into the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

from strata.bench.default_model import bench_model, cache_dir
from strata.api import load
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize


ALONE = 8  # requests, one at a time, for the unloaded figures (medians)


def question(c: int, r: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Client {c}, question {r}: what comes after {c * 7 + r}?"}]


async def streamed(api: openai.AsyncOpenAI, messages, max_tokens: int) -> dict[str, float]:
    """One streamed request: seconds to its first token and after it, and the tokens it got."""
    start = time.perf_counter()
    first = last = None
    tokens = 0
    stream = await api.chat.completions.create(model="bench", messages=messages, max_tokens=max_tokens,
                                               temperature=0, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        elif chunk.choices and chunk.choices[0].delta.role is None and chunk.choices[0].finish_reason is None:
            last = time.perf_counter()
            first = first or last
    if first is None:
        raise RuntimeError("a request got no token")
    return {"ttft": first - start, "decode": last - first, "tokens": tokens}


async def drive(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    """The clients' side, in a process of its own (as real clients are: no share in the server's GIL)."""
    async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as api:
        await streamed(api, question(0, 1), max_tokens)  # warm
        alone = [await streamed(api, question(98, r), max_tokens) for r in range(ALONE)]

        async def client(c: int) -> list[dict]:
            got = []
            for r in range(requests):
                try:
                    got.append(await streamed(api, question(c, r), max_tokens))
                except openai.RateLimitError:
                    got.append({"refused": True})
            return got

        start = time.perf_counter()
        outcomes = [o for many in await asyncio.gather(*(client(c) for c in range(clients))) for o in many]
        return {"alone": alone, "outcomes": outcomes, "wall": time.perf_counter() - start}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="per client, one after another")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--queue", type=int, default=64)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--engine", choices=["gpu", "reference"], default="gpu",
                        help="reference: the numpy engine, to try the benchmark on a tiny model without a GPU")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--drive", metavar="URL", help=argparse.SUPPRESS)  # the clients' process
    args = parser.parse_args()
    if args.drive:
        print(json.dumps(asyncio.run(drive(args.drive, args.clients, args.requests, args.max_tokens))))
        return
    path = args.model or bench_model(cache_dir(), synthesize)
    result: dict = {"model": Path(path).name, **{k: getattr(args, k) for k in
                                                 ("engine", "clients", "requests", "max_tokens", "sessions", "queue")}}
    options = {"progress": False} if args.engine == "gpu" else {}
    with load(str(path), engine=args.engine, **options) as model:
        direct = model.session(args.context)
        direct.chat_complete(question(0, 0), args.max_tokens)  # warm: graphs captured, pages touched
        ttft, rate = [], []
        for r in range(ALONE):
            answer = direct.chat_complete(question(99, r), args.max_tokens)
            ttft.append(direct.stats.prefill_seconds)
            rate.append(direct.stats.decode_tokens_per_second)
        result["direct"] = {"ttft": statistics.median(ttft), "prompt_tokens": answer.usage.prompt_tokens,
                            "tokens_per_second": statistics.median(rate)}
        direct.close()
        sessions = [model.session(args.context) for _ in range(args.sessions)]
        server = Server(sessions, "bench", max_waiting=args.queue)
        try:
            with serving(server) as url:
                command = [sys.executable, __file__, "--drive", url, "--clients", str(args.clients), "--requests",
                           str(args.requests), "--max-tokens", str(args.max_tokens)]
                # anywhere on the machine, as another program would be (this thread is pinned where the pool
                # pinned the loading thread, and a child would inherit that)
                every_cpu = range(os.cpu_count() or 1)
                clients = subprocess.run(command, capture_output=True, text=True,
                                         preexec_fn=lambda: os.sched_setaffinity(0, every_cpu))
                if clients.returncode:
                    raise SystemExit(f"the clients' process failed:\n{clients.stderr}")
                driven = json.loads(clients.stdout)
        finally:
            server.close()
            for session in sessions:
                session.close()
    alone, outcomes, wall = driven["alone"], driven["outcomes"], driven["wall"]
    result["alone"] = {"ttft": statistics.median(o["ttft"] for o in alone),
                       "tokens_per_second": statistics.median((o["tokens"] - 1) / o["decode"] for o in alone)}
    answered = [o for o in outcomes if "ttft" in o]
    assert len(outcomes) == args.clients * args.requests
    assert all(o["tokens"] == args.max_tokens for o in answered), "a request came back short"
    ttft = [o["ttft"] for o in answered]
    result["load"] = {"answered": len(answered), "refused": len(outcomes) - len(answered), "seconds": wall,
                      "tokens_per_second": sum(o["tokens"] for o in answered) / wall,
                      "ttft_p50": percentile(ttft, 0.5), "ttft_p90": percentile(ttft, 0.9), "ttft_max": max(ttft),
                      "stream_tokens_per_second_median": statistics.median(
                          (o["tokens"] - 1) / o["decode"] for o in answered)}
    d, a, load_ = result["direct"], result["alone"], result["load"]
    print(f"RESULT server alone (median of {ALONE}): ttft {a['ttft'] * 1e3:.0f} ms, {a['tokens_per_second']:.1f} tok/s; direct session: "
          f"ttft {d['ttft'] * 1e3:.0f} ms ({d['prompt_tokens']} prompt tokens), {d['tokens_per_second']:.1f} tok/s "
          f"(server/direct {a['tokens_per_second'] / d['tokens_per_second']:.3f})")
    print(f"RESULT server load {args.clients}x{args.requests}: {load_['answered']} answered, {load_['refused']} "
          f"refused in {wall:.1f} s, {load_['tokens_per_second']:.1f} tok/s aggregate, ttft p50 "
          f"{load_['ttft_p50']:.2f} s p90 {load_['ttft_p90']:.2f} s max {load_['ttft_max']:.2f} s, per stream "
          f"{load_['stream_tokens_per_second_median']:.1f} tok/s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
