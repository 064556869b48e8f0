"""Decode attention alone: attention_decode (split + merge) and qsa_select (block scoring + selection) of one
qwen4exp attention layer (24 q heads over 2 kv heads of 256; indexer 4 heads of 128, blocks of 4 tokens, 512 kept),
at contexts from 24 to 131,072 tokens, in every KV format.

    python benchmarks/bench_attention.py [--quick] [--reps 200] [--json PATH]

Each launch is timed alone with CUDA events, the L2 cache overwritten before it (median of --reps launches): in a
decode step the other layers' weights pass through the L2 between two calls of one layer's attention. `qsa`
attends the selection the indexer leaves (512 blocks spread over the context, plus the open tail: at most 2,051
tokens); `dense` attends every token, as a qwen3next layer does. The cache holds arbitrary finite values.
"""

from __future__ import annotations

import json

from strata import _native_check

from bench_gemv import bench_arguments

CONTEXTS = (24, 512, 3000, 32768, 131072)
KV_FORMATS = ("bf16", "int8", "q4", "k8v4")
HEADS, KV_HEADS, HEAD_DIM = 24, 2, 256
INDEXER_HEADS, INDEXER_DIM, RATIO, KEEP_BLOCKS = 4, 128, 4, 512
MODES = {"qsa": KEEP_BLOCKS, "dense": 0}


def attention_rows(contexts: tuple[int, ...], reps: int) -> list[dict]:
    rows = []
    for kv in KV_FORMATS:
        for mode, keep in MODES.items():
            for context in contexts:
                seconds = _native_check.time_attention_decode(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                                              kv=kv, context=context, keep_blocks=keep,
                                                              ratio=RATIO, reps=reps)
                rows.append({"kernel": "attention_decode", "kv": kv, "mode": mode, "context": context,
                             "us": seconds * 1e6})
    return rows


def indexer_rows(contexts: tuple[int, ...], reps: int) -> list[dict]:
    rows = []
    for kernel, top_only in (("qsa_select", False), ("qsa_top_blocks", True)):
        for context in contexts:
            seconds = _native_check.time_qsa_select(heads=INDEXER_HEADS, head_dim=INDEXER_DIM, context=context,
                                                    keep_blocks=KEEP_BLOCKS, ratio=RATIO, top_only=top_only,
                                                    reps=reps)
            rows.append({"kernel": kernel, "kv": "f32", "mode": "qsa", "context": context, "us": seconds * 1e6})
    return rows


def main() -> None:
    args = bench_arguments(__doc__, "few reps, contexts up to 3,000", 200)
    reps = 5 if args.quick else args.reps
    contexts = CONTEXTS[:3] if args.quick else CONTEXTS
    results = attention_rows(contexts, reps) + indexer_rows(contexts, reps)
    print(f"{'kernel':18} {'kv':5} {'mode':5} " + " ".join(f"{c:>9}" for c in contexts) + "  (us)")
    lines = {}
    for r in results:
        lines.setdefault((r["kernel"], r["kv"], r["mode"]), []).append(r["us"])
    for (kernel, kv, mode), times in lines.items():
        print(f"{kernel:18} {kv:5} {mode:5} " + " ".join(f"{us:9.1f}" for us in times))
    at = "/".join(str(c) for c in contexts)
    for (kernel, kv, mode), times in lines.items():
        if mode == "qsa":
            print(f"RESULT {kernel} {kv}: " + " ".join(f"{us:.1f}" for us in times) + f" us at {at} tokens")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
