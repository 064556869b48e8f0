"""Drafted decoding (docs/speculative.md): a verification step's cost and decode speed at forced acceptance rates.

    python3 benchmarks/bench_drafts.py [MODEL.gguf] [--expert-cache 0,auto] [--drafts 1,2,3,4] [--draft 3]
        [--rates 0.5,0.7,0.9] [--tokens 96] [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache). For each expert cache
budget: one session (token graph, KV int8) with row states for the most drafts; the plain step's seconds and a
verification step of k drafts as a multiple of it (strata.bench.drafts.verify_costs); then greedy decode of
`tokens` tokens plainly and with `--draft` drafts a step right with each probability of `--rates`
(forced_decode: the target's own greedy continuation drafted, so the speedup curve is known without trained
weights); then the session's own adaptive lookup drafts on a prompt that repeats itself.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import strata
from strata.bench.decode import prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.bench.drafts import forced_decode, verify_costs
from strata.synth import synthesize


def numbers(text: str, kind: type) -> list:
    return [kind(x) for x in text.split(",") if x]


def lookup_decode(model, prompt: list[int], tokens: int, drafts: int) -> dict[str, float]:
    """Greedy decode after a prompt that repeats itself, plain and with lookup drafts (the adaptive length)."""
    out = {}
    for draft in (None, "lookup"):
        session = model.session(len(prompt) + tokens + 8, draft=draft, draft_tokens=drafts)
        try:
            got = session.complete(prompt, tokens, temperature=0)
            s = session.stats
            out["lookup" if draft else "plain"] = {"tokens_per_second": (len(got.tokens) - 1) / s.decode_seconds,
                                                   "tokens_per_step": s.tokens_per_step,
                                                   "acceptance": s.acceptance_rate, "tokens": list(got.tokens)}
        finally:
            session.close()
    out["same_tokens"] = out["plain"].pop("tokens") == out["lookup"].pop("tokens")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--expert-cache", default="0,auto")
    parser.add_argument("--drafts", default="1,2,3,4")
    parser.add_argument("--draft", type=int, default=3)
    parser.add_argument("--rates", default="0.5,0.7,0.9")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    path = args.model or bench_model(cache_dir(), synthesize)
    drafts = numbers(args.drafts, int)
    results = {}
    for budget in args.expert_cache.split(","):
        model = strata.load(path, progress=False, expert_cache=0 if budget == "0" else budget)
        g = model.info.geometry
        rng = np.random.default_rng(7)
        prompt = prompt_ids(g, 16, rng)
        try:
            session = model.session(1024, draft="lookup", draft_tokens=max(max(drafts), args.draft))
            try:
                costs = verify_costs(session, prompt, drafts, 10, g.n_vocab, rng)
                print(f"RESULT cache={budget} step {costs['step_seconds'] * 1e3:.3f} ms; verify " +
                      ", ".join(f"k={k} {costs[f'verify_{k}_steps']:.2f} steps" for k in drafts), flush=True)
                forced = forced_decode(session, prompt, args.tokens, args.draft, numbers(args.rates, float),
                                       g.n_vocab)
            finally:
                session.close()
            print(f"RESULT cache={budget} plain {forced['plain_tokens_per_second']:.2f} tok/s (stepping's tokens are "
                  f"the verification rows' greedy ones: {forced['stepping_agrees']}); k={args.draft} " +
                  "; ".join(f"p={p:g} {v['tokens_per_second']:.2f} tok/s ({v['speedup']:.2f}x, "
                            f"{v['tokens_per_step']:.2f} tokens/step, acceptance {v['acceptance'] or 0:.2f}, "
                            f"same tokens {v['same_tokens']})" for p, v in forced["rates"].items()),
                  flush=True)
            repeating = (prompt * 8)[:120]
            lookup = lookup_decode(model, repeating, args.tokens, args.draft)
            print(f"RESULT cache={budget} repeating prompt: plain {lookup['plain']['tokens_per_second']:.2f} tok/s, "
                  f"lookup {lookup['lookup']['tokens_per_second']:.2f} tok/s "
                  f"({lookup['lookup']['tokens_per_step']:.2f} tokens/step, acceptance "
                  f"{lookup['lookup']['acceptance'] or 0:.2f}), same tokens {lookup['same_tokens']}", flush=True)
            results[budget] = {"verify": costs, "forced": forced, "lookup": lookup}
        finally:
            model.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
