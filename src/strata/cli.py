"""The `strata` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from strata.engine import MODES
from strata.errors import StrataError
from strata.kv import KV


def _version() -> str:
    try:
        return version("strata")
    except PackageNotFoundError:
        return "unknown"


def _doctor(_args: argparse.Namespace) -> int:
    from strata import doctor

    print(f"strata {_version()}")
    return doctor.run()


def _info(args: argparse.Namespace) -> int:
    from strata.format import inspect
    from strata.model_info import describe

    with inspect(args.model) as model:
        print("\n".join(describe(model)))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from strata.convert import convert
    from strata.progress import ByteProgress

    out = convert(args.hf_dir, args.out, outtype=args.outtype, progress=ByteProgress("convert"))
    print(out)
    return 0


def _synth(args: argparse.Namespace) -> int:
    from strata.progress import ByteProgress
    from strata.synth import synthesize

    types = {
        name: value
        for name, value in (
            ("experts", args.experts_type),
            ("expert_down", args.expert_down_type),
            ("dense", args.dense_type),
            ("embeddings", args.embeddings_type),
            ("ple", args.ple_type),
        )
        if value
    }
    if types:
        from strata.synth.presets import default_types

        types = {**vars(default_types(args.preset)), **types}
    out = synthesize(
        args.out,
        args.arch,
        preset=args.preset,
        n_layer=args.layers,
        types=types or None,
        seed=args.seed,
        progress=ByteProgress("synth"),
        full_ple=args.full_ple,
    )
    print(out)
    return 0


def _sampling(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repeat_penalty": args.repeat_penalty, "seed": args.seed, "stop": args.stop}


def _require_gpu(hint: str) -> None:
    """A one-line StrataError, with `hint`, where no CUDA device (or no native extension) is present."""
    try:
        from strata.devices import device_count

        count = device_count()
    except ImportError as error:
        raise StrataError(f"the native extension strata._native is not available ({error}); {hint}") from None
    if count == 0:
        raise StrataError(f"no CUDA device found (no NVIDIA driver or GPU); {hint}")


def _load(path: str):
    from strata.model import load

    return load(path, progress=True)


@contextmanager
def _session(args: argparse.Namespace) -> Iterator:
    """The Session of `--engine` on the model file, closed (with its model) on exit."""
    from strata.generation import Session

    if args.engine == "reference":
        from strata.format import inspect
        from strata.reference import Reference
        from strata.reference.engine import ReferenceEngine

        with inspect(args.model) as file:
            yield Session(ReferenceEngine(Reference(file), args.context), file.tokenizer())
        return
    _require_gpu("use --engine reference to run a small model on the CPU")
    with _load(args.model) as model:
        session = model.session(args.context, args.kv, args.mode)
        try:
            yield session
        finally:
            session.engine.close()


def _chat(args: argparse.Namespace) -> int:
    from strata.cli_chat import converse

    with _session(args) as session:
        converse(session, sys.stdin, sys.stdout, max_tokens=args.max_tokens, **_sampling(args))
    return 0


def _run(args: argparse.Namespace) -> int:
    with _session(args) as session:
        for piece in session.generate(args.prompt, args.max_tokens, **_sampling(args)):
            print(piece.text, end="", flush=True)
        print()
        stats = session.stats
        engine = args.engine if args.engine == "reference" else f"{args.engine} ({args.mode}, kv {args.kv})"
        print(f"[{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.2f} tok/s decode, "
              f"prompt {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s, "
              f"ended by {stats.finish_reason}; engine: {engine}]", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from strata import bench
    from strata.engine import MODES

    _require_gpu("strata bench measures the GPU engine; `strata bench pool` measures the CPU expert pool alone")
    path = args.model
    if path is None:
        from strata.progress import ByteProgress
        from strata.synth import synthesize

        path = bench.bench_model(bench.cache_dir(), synthesize, ByteProgress("bench: synth"))
    modes = list(MODES) if args.mode == "all" else [args.mode]
    with _load(str(path)) as model:
        bench.run(model, model_path=str(path), modes=modes, prompt_tokens=args.prompt_tokens, tokens=args.tokens,
                  context=args.context, json_path=args.json)
    return 0


def _bench_pool(args: argparse.Namespace) -> int:
    from strata.bench_pool import run

    run(quick=args.quick, k=args.k, isa=args.isa, json_path=args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata", description="Run very large Mixture-of-Experts models on one GPU plus the host."
    )
    parser.add_argument("--version", action="version", version=f"strata {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    doctor = commands.add_parser("doctor", help="what this machine offers strata, and a GPU self-test")
    doctor.set_defaults(handler=_doctor)
    info = commands.add_parser("info", help="validate a GGUF model file and describe it")
    info.add_argument("model", help="path of a .gguf file")
    info.set_defaults(handler=_info)

    convert = commands.add_parser("convert", help="a transformers checkpoint directory -> GGUF (llama.cpp layout)")
    convert.add_argument("hf_dir", help="directory written by save_pretrained (config.json + *.safetensors)")
    convert.add_argument("out", help="the .gguf file to write")
    convert.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    convert.set_defaults(handler=_convert)

    synth = commands.add_parser("synth", help="a GGUF with well-formed random weights, of any geometry")
    synth.add_argument("out", help="the .gguf file to write")
    synth.add_argument("--arch", default="qwen4exp", choices=["qwen4exp", "qwen3next", "qwen35moe"])
    synth.add_argument("--preset", default="tiny", choices=["tiny", "bench", "full"])
    synth.add_argument("--layers", type=int, default=None, help="layer count (default: the preset's)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--full-ple", action="store_true", help="the released n-gram table size (full preset)")
    for name in ("experts", "expert-down", "dense", "embeddings", "ple"):
        synth.add_argument(f"--{name}-type", default=None, metavar="TYPE", help=f"GGML type of the {name} tensors")
    synth.set_defaults(handler=_synth)

    run = commands.add_parser("run", help="generate text from a prompt, streamed")
    run.add_argument("-p", "--prompt", required=True)
    chat = commands.add_parser("chat", help="an interactive conversation (/reset, /exit)")
    for sub, handler in ((run, _run), (chat, _chat)):
        sub.add_argument("model", help="path of a .gguf file")
        sub.add_argument("-n", "--max-tokens", type=int, default=128)
        sub.add_argument("--engine", choices=["gpu", "reference"], default="gpu",
                         help="gpu: the decode session on GPU 0 plus the CPU expert pool (default); reference: "
                              "the numpy oracle (exact, slow: small models only)")
        sub.add_argument("--context", type=int, default=None,
                         help="tokens the session holds (default: the model's, at most 4096)")
        sub.add_argument("--kv", choices=[k.value for k in KV], default=KV.INT8.value, help="KV cache format (gpu)")
        sub.add_argument("--mode", choices=MODES, default="token_graph",
                         help="how the gpu engine launches a token: one CUDA graph, a graph per layer, or uncaptured")
        sub.add_argument("--temperature", type=float, default=0.0)
        sub.add_argument("--top-k", type=int, default=0)
        sub.add_argument("--top-p", type=float, default=1.0)
        sub.add_argument("--min-p", type=float, default=0.0)
        sub.add_argument("--repeat-penalty", type=float, default=1.0)
        sub.add_argument("--seed", type=int, default=None)
        sub.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
        sub.set_defaults(handler=handler)

    bench = commands.add_parser(
        "bench", help="decode speed of the GPU engine vs this machine's limit (`bench pool`: the CPU pool alone)",
        description="Greedy decode speed per session mode, its per-token breakdown and the machine's limit. "
                    "With no MODEL the default benchmark model (qwen4exp, 16 layers, about 26 GB) is synthesized "
                    "once into the user cache. `strata bench pool --help`: the CPU expert pool benchmark.")
    bench.add_argument("model", nargs="?", default=None, metavar="MODEL",
                       help="a .gguf file (default: the synthesized benchmark model)")
    bench.add_argument("--tokens", type=int, default=128, help="tokens decoded per mode (default 128)")
    bench.add_argument("--prompt-tokens", type=int, default=16, help="random prompt tokens first (default 16)")
    bench.add_argument("--mode", choices=[*MODES, "all"], default="all", help="session mode(s) to measure")
    bench.add_argument("--context", type=int, default=None, help="session context (default: prompt + tokens)")
    bench.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    bench.set_defaults(handler=_bench)
    return parser


def build_bench_pool_parser() -> argparse.ArgumentParser:
    """`strata bench pool`: parsed apart from `strata bench [MODEL]`, whose optional MODEL argparse could not
    tell from a sub-command."""
    pool = argparse.ArgumentParser(
        prog="strata bench pool", description="CPU expert pool: GB/s per layer job vs the machine's read bandwidth")
    pool.add_argument("--quick", action="store_true", help="small expert sets (a smoke run)")
    pool.add_argument("--isa", choices=("avx2", "avx512"), default=None, help="force a kernel ISA")
    pool.add_argument("-k", type=int, default=10, help="routed experts per layer job (default 10)")
    pool.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    pool.set_defaults(handler=_bench_pool, command="bench pool")
    return pool


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "pool"]:
        return build_bench_pool_parser().parse_args(argv[2:])
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.handler(args)
    except StrataError as error:
        print(f"strata {args.command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"strata {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
