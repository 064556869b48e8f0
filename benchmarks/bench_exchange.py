"""The per-token cost of the GPU <-> CPU expert exchange at qwen4exp width, in the session's three modes.

Per MoE layer: the GPU publishes x, ids, weights and rings; the CPU pool computes k = 10 Q4_K experts
(2560 -> 640 -> 2560) and answers; the GPU waits and consumes. No model math on the GPU side, so the
figures are the exchange plus the pool: the floor under a decode token's routed-expert time.
    python3 benchmarks/bench_exchange.py [--layers 16] [--experts 64] [--tokens 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check
from strata.options import Mode
from strata.quant import repack
from strata.quant.synthetic import random_blocks
from strata.runtime.pool import ExpertPool

N, FF, K = 2560, 640, 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--experts", type=int, default=64, help="per layer; enough to defeat the caches")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results = {}
    with ExpertPool(N, FF, K) as pool:
        for layer in range(args.layers):
            gate, up = (repack(random_blocks(T.Q4_K, N * FF * args.experts, rng), T.Q4_K, (N, FF, args.experts))
                        for _ in "gu")
            down = repack(random_blocks(T.Q4_0, N * FF * args.experts, rng), T.Q4_0, (FF, N, args.experts))
            pool.set_layer(layer, gate, up, down, args.experts)
        expert_bytes = pool.layer_bytes(0)
        x = (rng.standard_normal((args.layers, N)) * 0.1).astype(np.float32)
        ids = np.stack([rng.choice(args.experts, K, replace=False) for _ in range(args.layers)]).astype(np.int32)
        weights = rng.dirichlet(np.ones(K), args.layers).astype(np.float32)
        print(f"{args.layers} layers, k={K}, {expert_bytes * K / 1e6:.1f} MB of expert weights per layer, "
              f"{pool.threads} workers ({pool.isa})")
        print(f"{'mode':<14}{'ms/token':>10}{'ring wait':>11}{'pool':>9}{'other':>9}   (ms per token)")
        for mode in Mode:
            _native_check.expert_exchange(pool.native, mode, x, ids, weights, 2)  # warm: capture, page faults
            _, t = _native_check.expert_exchange(pool.native, mode, x, ids, weights, args.tokens)
            ms = {key: t[key] * 1e3 for key in ("seconds_per_token", "ring_wait_seconds", "pool_seconds")}
            other = ms["seconds_per_token"] - ms["ring_wait_seconds"] - ms["pool_seconds"]
            print(f"{mode.value:<14}{ms['seconds_per_token']:>10.3f}{ms['ring_wait_seconds']:>11.3f}"
                  f"{ms['pool_seconds']:>9.3f}{other:>9.3f}")
            results[mode.value] = {**ms, "expert_gb_per_s": expert_bytes * K * args.layers / t["pool_seconds"] / 1e9}
    for mode, r in results.items():
        print(f"RESULT exchange {mode}: {r['seconds_per_token']:.3f} ms/token for {args.layers} layers, "
              f"pool {r['expert_gb_per_s']:.1f} GB/s of expert bytes, ring wait {r['ring_wait_seconds']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
