"""`strata bench [MODEL]`: greedy decode speed per session mode, where each token's time goes, and how close
that is to this machine's limit, at rates measured here; then prompt processing at a few prompt lengths. The
measuring is strata.bench's (strata.bench.run); this module parses the command line. With no MODEL, the default
benchmark model is synthesized once into the user cache.
"""

from __future__ import annotations

from strata.bench.default_model import bench_model, cache_dir
from strata.bench.records import write_json
from strata.bench.run import cache_sweep, run
from strata.cli.help import ShowDefaults
from strata.errors import InvalidArgument
from strata.options import DEFAULT_KV, KV, Mode


def register(commands) -> None:
    from strata.cli.session import (
        add_control_vector_arguments, add_deferral_argument, add_draft_arguments, add_placement_arguments,
    )

    sub = commands.add_parser(
        "bench", help="decode speed of the GPU engine vs this machine's limit (`bench pool`: the CPU pool alone)",
        description="Greedy decode speed per session mode, its per-token breakdown and the machine's limit. "
                    "With no MODEL the default benchmark model (qwen4exp, 16 layers, about 26 GB) is synthesized "
                    "once into the user cache. `strata bench pool --help`: the CPU expert pool benchmark.",
        formatter_class=ShowDefaults)
    sub.add_argument("model", nargs="?", default=None, metavar="MODEL",
                     help="a .gguf file (default: the synthesized benchmark model)")
    sub.add_argument("--tokens", type=int, default=128, help="tokens decoded per mode (default 128)")
    sub.add_argument("--prompt-tokens", type=int, default=16, help="random prompt tokens first (default 16)")
    sub.add_argument("--mode", choices=[*Mode.values(), "all"], default="all", help="session mode(s) to measure")
    sub.add_argument("--context", type=int, default=None, help="session context (default: prompt + tokens)")
    sub.add_argument("--kv", choices=KV.values(), default=DEFAULT_KV.value, help="KV cache format")
    sub.add_argument("--kv-streaming", action="store_true",
                     help="the attention KV in page-locked host memory, a VRAM window of what QSA selects")
    add_deferral_argument(sub)
    add_draft_arguments(sub)
    add_control_vector_arguments(sub)
    sub.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    sub.add_argument("--prompt-lengths", default="512,4096", metavar="TOKENS",
                     help="prompt path speed at these prompt lengths, beside stepping them (0: none)")
    add_placement_arguments(sub)
    sub.add_argument("--cache-shares", default=None, metavar="PERCENTS",
                     help="sweep the expert cache over these shares of every layer's routed experts, e.g. "
                          "0,25,50,75,100 (the model loads without a cache; each share is filled in turn)")
    sub.set_defaults(handler=handle)


def prompt_lengths(text: str) -> tuple[int, ...]:
    """--prompt-lengths: comma-separated token counts; 0 stands for none."""
    try:
        return tuple(int(n) for n in text.split(",") if int(n) != 0)
    except ValueError:
        raise InvalidArgument(f"--prompt-lengths takes token counts such as 512,4096, got {text!r}") from None


def cache_shares(text: str) -> list[float]:
    """--cache-shares: comma-separated percentages, as shares 0..1 (strata.bench.run.cache_sweep checks them)."""
    try:
        return [float(p) / 100 for p in text.split(",")]
    except ValueError:
        raise InvalidArgument(f"--cache-shares takes percentages such as 0,50,100, got {text!r}") from None


def handle(args) -> int:
    import strata
    from strata.cli.session import control_vectors, placement, require_gpu

    require_gpu("strata bench measures the GPU engine; `strata bench pool` measures the CPU expert pool alone")
    lengths = prompt_lengths(args.prompt_lengths)  # a wrong option is refused before the synth and the load
    shares = None if args.cache_shares is None else cache_shares(args.cache_shares)
    path = args.model
    if path is None:
        from strata.progress import ByteProgress
        from strata.synth import synthesize

        path = bench_model(cache_dir(), synthesize, ByteProgress("bench: synth"))
    modes = list(Mode) if args.mode == "all" else [Mode.parse(args.mode)]
    options = {"model_path": str(path), "modes": modes, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
               "context": args.context, "kv": args.kv, "prompt_lengths": lengths,
               "kv_streaming": args.kv_streaming, "defer_experts": args.defer_experts, "draft": args.draft,
               "draft_tokens": args.draft_tokens, **control_vectors(args)}
    if shares is None:
        with strata.load(str(path), **placement(args)) as model:
            run(model, **options, emit=print, json_path=args.json)
        return 0
    with strata.load(str(path), **{**placement(args), "expert_cache": 0}) as model:
        results = cache_sweep(model, shares, args.cache_policy, emit=print, **options)
    if args.json:
        write_json(args.json, results)
    return 0
