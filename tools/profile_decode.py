"""Per-kernel GPU time of decode tokens (a development tool): loads MODEL, decodes a few warm-up tokens,
then profiles `--tokens` more in the chosen mode with torch's CUDA profiler (CUPTI sees every kernel of the
process, strata's included) and prints the kernels by total time per token. With `--prompt N` it profiles one
prompt of N ids through the prompt path instead (times per prompt token; `--expert-cache` as strata.load's).

    python tools/profile_decode.py MODEL [--mode uncaptured] [--tokens 8] [--prompt 4096 [--expert-cache 0]]
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
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import strata
    from strata.sampling import SamplingParams

    cache = args.expert_cache if not args.expert_cache.isdigit() else int(args.expert_cache)
    model = strata.load(args.model, progress=False, expert_cache=cache)
    session = model.session(max(256, args.prompt + 256), mode=args.mode)
    engine = session.engine
    g = model.info.geometry
    rng = np.random.default_rng(0)
    history = [int(t) for t in rng.integers(0, g.n_vocab - 1, 64 if args.prompt else 8)]
    greedy = SamplingParams()
    token = engine.feed(history, greedy, 0.0, history)
    torch.cuda.init()
    if args.prompt:
        engine.reset()
        history = [int(t) for t in rng.integers(0, g.n_vocab - 1, args.prompt)]
        args.tokens = args.prompt
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if args.prompt:
            engine.feed(history, greedy, 0.0, history)
        for _ in range(0 if args.prompt else args.tokens):
            history.append(token)
            token = engine.feed([token], greedy, 0.0, history)
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = totals.setdefault(event.name[:90], [0.0, 0])
            entry[0] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            entry[1] += 1
    total = sum(v[0] for v in totals.values())
    what = "prompt" if args.prompt else args.mode
    print(f"GPU busy {total / args.tokens / 1e3:.3f} ms/token over {args.tokens} tokens ({what})")
    for name, (us, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:args.rows]:
        print(f"{us / args.tokens:9.1f} us/token {count / args.tokens:6.1f} calls/token  {name}")
    engine.close()
    model.close()


if __name__ == "__main__":
    main()
