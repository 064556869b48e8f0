"""The memory plan's largest context, checked against the GPU: with only `--free-gib` of VRAM left free beside the
loaded model (the rest taken by a torch allocation), a session of the context the plan predicts opens and decodes,
and one KV page more is refused (docs/performance.md, "Long contexts").

    python3 benchmarks/check_largest_context.py MODEL.gguf [--free-gib 3] [--kv bf16,int8,k8v4,q4] [--stream off,on]

Per (format, streaming): the predicted context, the plan's VRAM for it against what opening the session took
from the device's free memory, and whether the page above was refused. Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import sys

import torch

import strata
from strata.runtime.plan import file_tensors, kv_page_tokens, memory_plan
from strata.sampling import SamplingParams

GIB = 1 << 30
MODEL_PARTS = ("dense weights", "expert cache", "prompt staging")  # in place since load


def check(model, kv: str, streaming: bool) -> bool:
    g = model.info.geometry
    context = model.largest_context(kv, streaming)
    label = f"kv {kv:5s} streaming {'on ' if streaming else 'off'}"
    if context == 0:
        print(f"{label}: nothing fits")
        return False
    before = torch.cuda.mem_get_info()[0]
    session = model.session(context, kv=kv, kv_streaming=streaming)
    took = before - torch.cuda.mem_get_info()[0]
    chunk = session.engine.native.prompt_chunk  # fitted into what the session left
    plan = memory_plan(g, file_tensors(model.file), context, kv, prompt_chunk=chunk, kv_streaming=streaming)
    session_plan = sum(n for part, n in plan.vram.items() if part not in MODEL_PARTS)
    try:
        engine, history, token = session.engine, [], 1
        for _ in range(4):
            history.append(token)
            token = engine.feed([token], SamplingParams(), 0.0, history)
    finally:
        session.close()
    above = context + kv_page_tokens()
    refused = above > g.context_length
    if not refused:
        try:
            model.session(above, kv=kv, kv_streaming=streaming).close()
        except strata.OutOfMemory:
            refused = True
    print(f"{label}: largest context {context:7d} opened and decoded; plan {session_plan / GIB:6.3f} GiB "
          f"(prompt chunk {chunk}), the device gave {took / GIB:6.3f} GiB; "
          f"{above} {'refused' if refused else 'NOT refused'}", flush=True)
    return refused


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--free-gib", type=float, default=3.0)
    parser.add_argument("--kv", default="bf16,int8,k8v4,q4")
    parser.add_argument("--stream", default="off,on")
    args = parser.parse_args()
    ok = True
    with strata.load(args.model, expert_cache=0, progress=False) as model:
        free = torch.cuda.mem_get_info()[0]
        blob = torch.empty(max(0, free - int(args.free_gib * GIB)), dtype=torch.uint8, device="cuda")
        print(f"VRAM free beside the model: {torch.cuda.mem_get_info()[0] / GIB:.2f} GiB", flush=True)
        for kv in args.kv.split(","):
            for stream in args.stream.split(","):
                ok = check(model, kv, stream == "on") and ok
        del blob
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
