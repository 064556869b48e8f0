"""Per-kernel GPU time of decode tokens (a development tool): loads MODEL, decodes a few warm-up tokens,
then profiles `--tokens` more in the chosen mode with torch's CUDA profiler (CUPTI sees every kernel of the
process, strata's included) and prints the kernels by total time per token. With `--prompt N` it profiles one
prompt of N ids through the prompt path instead (times per prompt token; `--expert-cache` as strata.load's).
With `--depth D` the decoded tokens follow a prompt of D ids. `--timeline` adds, per layer of the last token, the
GPU's span before its ring (from the previous ring's answer to its publish), the kernels in it, the time in which
one of them runs and the rest, and the last token's first layers kernel by kernel with what each adds to the
chain. With `--batch B` it profiles `--tokens` batched steps of B sessions at once (GpuEngine.step_batch,
docs/batch.md), per step; with `--verify K` it profiles `--tokens` verification steps of K + 1 rows (each cut back to
its first row after), per step. Kernels launch with programmatic dependent launch (kernels/launch.cuh), so a kernel's profiled time includes
its wait for the one before it: the totals per kernel overstate, what a kernel adds to the chain does not.

    python tools/profile_decode.py MODEL [--mode uncaptured] [--tokens 8] [--depth 3000] [--timeline]
                                   [--prompt 4096 [--expert-cache 0]] [--batch 8] [--verify 3]
                                   [--control-vector V.gguf]
"""

from __future__ import annotations

import argparse

import numpy as np

from strata.options import Mode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", default=Mode.TOKEN_GRAPH.value, choices=Mode.values())
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--prompt", type=int, default=0)
    parser.add_argument("--expert-cache", default="auto")
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--verify", type=int, default=0)
    parser.add_argument("--control-vector", default=None, metavar="FILE",
                        help="steer the profiled session with FILE at scale 1 (to compare its kernels with a run without)")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import strata
    from strata.sampling import SamplingParams

    cache = args.expert_cache if not args.expert_cache.isdigit() else int(args.expert_cache)
    model = strata.load(args.model, progress=False, expert_cache=cache)
    options = dict(draft="lookup", draft_tokens=args.verify) if args.verify else {}
    if args.control_vector:
        options["control_vectors"] = [(args.control_vector, 1.0)]
    session = model.session(max(256, args.prompt + args.depth + 256), mode=args.mode, **options)
    engine = session.engine
    g = model.info.geometry
    rng = np.random.default_rng(0)
    history = [int(t) for t in rng.integers(0, g.n_vocab - 1, 64 if args.prompt else max(8, args.depth))]
    greedy = SamplingParams()
    token = engine.feed(history, greedy, 0.0, history)
    torch.cuda.init()
    if args.prompt:
        engine.reset()
        history = [int(t) for t in rng.integers(0, g.n_vocab - 1, args.prompt)]
        args.tokens = args.prompt
    batch = None
    if args.batch > 1 and not args.prompt:
        batch = Batch(model, session, args, rng)
        batch.step(2)  # the graph of this member set captured, outside the profile
    verify = Verify(engine, history, token, args.verify, rng, g.n_vocab) if args.verify and not args.prompt else None
    if verify:
        verify.step(2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if args.prompt:
            engine.feed(history, greedy, 0.0, history)
        elif batch:
            batch.step(args.tokens)
        elif verify:
            verify.step(args.tokens)
        for _ in range(0 if args.prompt or batch or verify else args.tokens):
            history.append(token)
            token = engine.feed([token], greedy, 0.0, history)
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = totals.setdefault(event.name[:90], [0.0, 0])
            entry[0] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            entry[1] += 1
    adds = chain_adds(prof.events())
    total = sum(v[0] for v in totals.values())
    what = ("prompt" if args.prompt else f"batched steps of {args.batch}, {args.mode}" if batch
            else f"verification steps of {args.verify + 1} rows" if verify else args.mode)
    unit = "step" if batch or verify else "token"
    print(f"GPU busy {total / args.tokens / 1e3:.3f} ms/{unit} over {args.tokens} {unit}s ({what}); the chain "
          f"{sum(adds.values()) / args.tokens / 1e3:.3f} ms/{unit} busy within a span of "
          f"{gpu_span(prof.events()) / args.tokens / 1e3:.3f}")
    print(f"{'us/' + unit:>9s} {'adds':>9s} {'calls':>6s}")
    for name, (us, count) in sorted(totals.items(), key=lambda kv: -adds.get(kv[0], 0.0))[:args.rows]:
        print(f"{us / args.tokens:9.1f} {adds.get(name, 0.0) / args.tokens:9.1f} {count / args.tokens:6.1f}  {name}")
    if args.timeline and not args.prompt:
        print_timeline(prof.events())
    if batch:
        batch.close()
    engine.close()
    model.close()


class Batch:
    """`--batch` sessions (the profiled session first), each after a prompt of its own, stepped together."""

    def __init__(self, model, session, args, rng) -> None:
        from strata.sampling import SamplingParams

        self.greedy = SamplingParams()
        self.sessions = [session] + [model.session(session.engine.context, mode=args.mode)
                                     for _ in range(args.batch - 1)]
        vocab = model.info.geometry.n_vocab
        self.histories = [[int(t) for t in rng.integers(0, vocab - 1, 8 + i)] for i in range(args.batch)]
        self.engines = [s.engine for s in self.sessions]
        for e in self.engines:
            e.reset()
        self.tokens = [e.feed(h, self.greedy, 0.0, h) for e, h in zip(self.engines, self.histories)]

    def step(self, steps: int) -> None:
        from strata.runtime.engine import GpuEngine

        for _ in range(steps):
            for h, t in zip(self.histories, self.tokens):
                h.append(t)
            self.tokens = GpuEngine.step_batch(self.engines, self.tokens, [self.greedy] * len(self.engines),
                                               [0.0] * len(self.engines), [list(h) for h in self.histories])

    def close(self) -> None:
        for s in self.sessions[1:]:
            s.close()


class Verify:
    """Verification steps of k + 1 random ids on `engine`, each cut back to its first row, so the sequence advances
    one token a step as a rejected draft leaves it."""

    def __init__(self, engine, history, token, k, rng, vocab) -> None:
        self.engine, self.history, self.k, self.rng, self.vocab = engine, history, k, rng, vocab
        self.history.append(token)
        self.engine.feed([token], _greedy(), 0.0, self.history)

    def step(self, steps: int) -> None:
        for _ in range(steps):
            ids = [int(t) for t in self.rng.integers(0, self.vocab - 1, self.k + 1)]
            start = self.engine.position
            self.engine.verify(ids, self.history + ids)
            self.engine.truncate(start + 1)
            self.history.append(ids[0])


def _greedy():
    from strata.sampling import SamplingParams

    return SamplingParams()


def chain_adds(events) -> dict[str, float]:
    """Per kernel name, the microseconds its launches add to the end of the GPU's chain (kernels in start order;
    under programmatic dependent launch a kernel's own duration includes its wait for the one before it)."""
    kernels = sorted((e for e in events if e.device_type.name == "CUDA" and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    adds: dict[str, float] = {}
    chain_end = kernels[0].time_range.start if kernels else 0.0
    for e in kernels:
        adds[e.name[:90]] = adds.get(e.name[:90], 0.0) + max(0.0, e.time_range.end - max(chain_end, e.time_range.start))
        chain_end = max(chain_end, e.time_range.end)
    return adds


def gpu_span(events) -> float:
    """Microseconds from the first kernel's start to the last one's end."""
    ranges = [e.time_range for e in events if e.device_type.name == "CUDA" and e.time_range.elapsed_us() > 0]
    return max(r.end for r in ranges) - min(r.start for r in ranges) if ranges else 0.0


def print_timeline(events) -> None:
    """The last token's kernels in start order: per layer the span before the ring, and its first layers in full.

    Kernels launch with programmatic dependent launch (kernels/launch.cuh): a kernel's CTAs start while the kernel
    before it runs and wait for it, so its recorded start and duration include that wait. A layer's span is
    therefore measured between ends, from the previous ring's answer (its doorbell_wait's end) to its publish (its
    route_publish's end), and each kernel's cost is what it adds to the chain's end ("adds")."""
    kernels = sorted((e for e in events if e.device_type.name == "CUDA" and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    waits = [i for i, e in enumerate(kernels) if "doorbell_wait" in e.name]
    # The router's one launch ends with the publish (kernels/router_publish.cuh). A layer the VRAM cache holds
    # whole launches it too without ringing, so the spans below are per layer only when every layer rings.
    publishes = [i for i, e in enumerate(kernels) if "route_publish" in e.name]
    if not waits or not publishes:
        print("timeline: no doorbell kernels (every layer's experts in VRAM?)")
        return
    begins = [i for i, e in enumerate(kernels) if "record_token" in e.name]  # one per token, in begin()
    start = begins[-1] if begins else 0
    last = [p for p in publishes if p > start]
    print(f"\nlast token, {len(last)} ringing layers: GPU before each ring (us, from the answer before to the publish)")
    print(f"{'layer':>5s} {'span':>7s} {'kernels':>7s} {'busy':>7s} {'gaps':>7s}")
    answered = kernels[start].time_range.start
    spans = []
    for layer, pub in enumerate(last):
        published = kernels[pub].time_range.end
        window = [e for e in kernels[start:] if answered < e.time_range.end <= published]
        span = published - answered
        busy = _busy(window, answered)
        spans.append((span, len(window), busy))
        print(f"{layer:5d} {span:7.1f} {len(window):7d} {busy:7.1f} {span - busy:7.1f}")
        later = [w for w in waits if w > pub]
        answered = kernels[later[0]].time_range.end if later else published
    mean = [sum(v[i] for v in spans) / len(spans) for i in range(3)]
    print(f" mean {mean[0]:7.1f} {mean[1]:7.1f} {mean[2]:7.1f} {mean[0] - mean[2]:7.1f}")
    print("\nthe last token's first layers, kernel by kernel (us: start, duration with any wait for the kernel "
          "before, what it adds to the chain's end):")
    t0 = kernels[start].time_range.start
    chain_end = t0
    stop = last[min(3, len(last) - 1)]
    for e in kernels[start:stop + 1]:
        r = e.time_range
        print(f"{r.start - t0:9.1f} {r.elapsed_us():7.1f} {max(0.0, r.end - chain_end):6.1f}  {_short(e.name)}")
        chain_end = max(chain_end, r.end)


def _short(name: str) -> str:
    for noise in ("void ", "strata::", "kernels::", "(anonymous namespace)::"):
        name = name.replace(noise, "")
    return name[:100]


def _busy(window, since: float) -> float:
    """Microseconds after `since` in which at least one kernel of `window` runs (branches overlap)."""
    busy, end = 0.0, since
    for e in sorted(window, key=lambda e: e.time_range.start):
        s, t = max(e.time_range.start, end), e.time_range.end
        if t > s:
            busy += t - s
            end = t
    return busy


if __name__ == "__main__":
    main()
