"""The `strata` command."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from strata.errors import StrataError


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


def _reference_session(model):
    from strata.generation import Session
    from strata.reference import Reference
    from strata.reference.engine import ReferenceEngine

    return Session(ReferenceEngine(Reference(model)), model.tokenizer())


def _chat(args: argparse.Namespace) -> int:
    from strata.cli_chat import converse
    from strata.format import inspect

    with inspect(args.model) as model:
        converse(_reference_session(model), sys.stdin, sys.stdout, max_tokens=args.max_tokens, **_sampling(args))
    return 0


def _run(args: argparse.Namespace) -> int:
    from strata.format import inspect

    with inspect(args.model) as model:
        session = _reference_session(model)
        for piece in session.generate(args.prompt, args.max_tokens, **_sampling(args)):
            print(piece.text, end="", flush=True)
        print()
        stats = session.stats
        print(f"[{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.2f} tok/s decode, "
              f"prompt {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s, "
              f"ended by {stats.finish_reason}; engine: {args.engine}]", file=sys.stderr)
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
        sub.add_argument("--engine", choices=["reference"], default="reference",
                         help="reference: the numpy oracle (exact, slow: small models only); the GPU engine "
                              "arrives with the decode session")
        sub.add_argument("--temperature", type=float, default=0.0)
        sub.add_argument("--top-k", type=int, default=0)
        sub.add_argument("--top-p", type=float, default=1.0)
        sub.add_argument("--min-p", type=float, default=0.0)
        sub.add_argument("--repeat-penalty", type=float, default=1.0)
        sub.add_argument("--seed", type=int, default=None)
        sub.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
        sub.set_defaults(handler=handler)

    bench = commands.add_parser("bench", help="measure strata on this machine")
    targets = bench.add_subparsers(dest="target", required=True, metavar="TARGET")
    pool = targets.add_parser("pool", help="CPU expert pool: GB/s per layer job vs the machine's read bandwidth")
    pool.add_argument("--quick", action="store_true", help="small expert sets (a smoke run)")
    pool.add_argument("--isa", choices=("avx2", "avx512"), default=None, help="force a kernel ISA")
    pool.add_argument("-k", type=int, default=10, help="routed experts per layer job (default 10)")
    pool.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    pool.set_defaults(handler=_bench_pool)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
