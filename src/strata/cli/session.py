"""What `strata run` and `strata chat` share: their options, the sampling they pass on, and the session they
open on the chosen engine."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from strata.errors import StrataError
from strata.options import KV, Mode


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("model", help="path of a .gguf file")
    sub.add_argument("-n", "--max-tokens", type=int, default=128)
    sub.add_argument("--engine", choices=["gpu", "reference"], default="gpu",
                     help="gpu: the decode session on GPU 0 plus the CPU expert pool (default); reference: "
                          "the numpy oracle (exact, slow: small models only)")
    sub.add_argument("--context", type=int, default=None,
                     help="tokens the session holds (default: the model's, at most 4096)")
    sub.add_argument("--kv", choices=KV.values(), default=KV.INT8.value, help="KV cache format (gpu)")
    sub.add_argument("--mode", choices=Mode.values(), default=Mode.TOKEN_GRAPH.value,
                     help="how the gpu engine launches a token: one CUDA graph, a graph per layer, or uncaptured")
    sub.add_argument("--temperature", type=float, default=0.0)
    sub.add_argument("--top-k", type=int, default=0)
    sub.add_argument("--top-p", type=float, default=1.0)
    sub.add_argument("--min-p", type=float, default=0.0)
    sub.add_argument("--repeat-penalty", type=float, default=1.0)
    sub.add_argument("--seed", type=int, default=None)
    sub.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")


def sampling(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repeat_penalty": args.repeat_penalty, "seed": args.seed, "stop": args.stop}


def require_gpu(hint: str) -> None:
    """A one-line StrataError, with `hint`, where no CUDA device (or no native extension) is present."""
    try:
        from strata.devices import device_count

        count = device_count()
    except ImportError as error:
        raise StrataError(f"the native extension strata._native is not available ({error}); {hint}") from None
    if count == 0:
        raise StrataError(f"no CUDA device found (no NVIDIA driver or GPU); {hint}")


@contextmanager
def opened(args: argparse.Namespace) -> Iterator:
    """The Session of `--engine` on the model file, closed (with its model) on exit."""
    from strata.generation import Session

    if args.engine == "reference":
        from strata.format import inspect
        from strata.reference import Reference
        from strata.reference.engine import ReferenceEngine

        with inspect(args.model) as file:
            yield Session(ReferenceEngine(Reference(file), args.context), file.tokenizer())
        return
    require_gpu("use --engine reference to run a small model on the CPU")
    from strata.runtime.model import load

    with load(args.model, progress=True) as model:
        session = model.session(args.context, args.kv, args.mode)
        try:
            yield session
        finally:
            session.engine.close()
