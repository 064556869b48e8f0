"""What `strata run`, `strata chat` and `strata serve` share: their options, the sampling they pass on, and the
model and sessions they open on the chosen engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from strata.errors import InvalidArgument, StrataError
from strata.generation.drafts import DEFAULT_DRAFT_TOKENS, MAX_DRAFT_TOKENS, checked_draft_tokens
from strata.options import (
    DEFAULT_CACHE_POLICY, DEFAULT_CONTEXT, DEFAULT_EXPERT_CACHE, DEFAULT_KV, DEFAULT_MODE, KV, Mode,
)

# options the reference engine has no use for
GPU_ONLY = ("kv", "kv_streaming", "mode", "expert_cache", "cache_policy", "vram_limit", "ram_budget")
MAX_GRAMMAR_BYTES = 1 << 20  # a --json-schema or --grammar file larger is refused unread (a grammar is 64 KiB at most)


class _Given(argparse.Action):
    """Stores the value and remembers that the user gave the option (so an ignored one can be named)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", set()) | {self.dest}


class _GivenFlag(_Given):
    """A flag (no value) that is remembered as given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


def add_engine_arguments(sub: argparse.ArgumentParser) -> None:
    """The model file, the engine and the session's shape."""
    sub.add_argument("model", nargs="?", default=argparse.SUPPRESS, help="path of a .gguf file (or -m)")
    sub.add_argument("-m", "--model", dest="model_option", default=None, metavar="MODEL",
                     help="path of a .gguf file, as llama.cpp's tools take it")
    sub.add_argument("--engine", choices=["gpu", "reference"], default="gpu",
                     help="gpu: the decode session on GPU 0 plus the CPU expert pool; reference: the numpy oracle "
                          "on the CPU (exact, slow: small models; no GPU needed)")
    sub.add_argument("-c", "--context", "--ctx-size", type=int, default=None,
                     help=f"tokens the session holds (default: the model's, at most {DEFAULT_CONTEXT})")
    sub.add_argument("--kv", choices=KV.values(), default=DEFAULT_KV.value, action=_Given,
                     help="KV cache format (gpu engine)")
    sub.add_argument("--kv-streaming", nargs=0, default=False, action=_GivenFlag,
                     help="keep the attention KV in page-locked host memory and only what QSA selects in VRAM "
                          "(gpu engine, qwen4exp): long contexts on little VRAM")
    sub.add_argument("--mode", choices=Mode.values(), default=DEFAULT_MODE.value, action=_Given,
                     help="how the gpu engine launches a token: one CUDA graph, a graph per layer, or uncaptured")
    add_deferral_argument(sub)
    add_draft_arguments(sub)
    add_control_vector_arguments(sub)
    add_placement_arguments(sub, _Given)


def add_control_vector_arguments(sub: argparse.ArgumentParser) -> None:
    """llama.cpp's control-vector flags (docs/control_vectors.md): both engines apply them."""
    sub.add_argument("--control-vector", action="append", default=None, metavar="FILE",
                     help="add a control vector (a llama.cpp control-vector .gguf, scale 1; repeatable: the "
                          "vectors sum)")
    sub.add_argument("--control-vector-scaled", action="append", nargs=2, default=None, metavar=("FILE", "SCALE"),
                     help="add a control vector times SCALE (repeatable)")
    sub.add_argument("--control-vector-layer-range", nargs=2, type=int, default=None, metavar=("START", "END"),
                     help="steer only layers START..END, both inclusive (default: every layer); needs "
                          "--control-vector or --control-vector-scaled")


def control_vectors(args: argparse.Namespace) -> dict:
    """Model.session's control_vectors and control_layers from the command line, --control-vector's files
    first (scale 1), then --control-vector-scaled's."""
    pairs = [(path, 1.0) for path in args.control_vector or ()]
    for path, scale in args.control_vector_scaled or ():
        try:
            pairs.append((path, float(scale)))
        except ValueError:
            raise InvalidArgument(f"--control-vector-scaled {path} {scale}: SCALE must be a number") from None
    layers = args.control_vector_layer_range
    return {"control_vectors": pairs, "control_layers": None if layers is None else tuple(layers)}


def add_draft_arguments(sub: argparse.ArgumentParser) -> None:
    """--draft and --draft-tokens: drafted tokens verified together (speculative decoding), on either engine."""
    sub.add_argument("--draft", choices=["lookup", "mtp", "auto"], default=None,
                     help="draft tokens and verify them in one step, the output unchanged: lookup proposes what "
                          "followed the last n-gram's earlier occurrence in the text (no weights; pays where the "
                          "answer repeats its context); mtp: the file's MTP block (qwen4exp, qwen3next, "
                          "qwen35moe; the reference engine only, for now); auto: lookup, the drafter every model has; "
                          "the number drafted per step follows the measured cost and acceptance (default: none)")
    sub.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, metavar="K", action=_Given,
                     help=f"the most tokens drafted per step (1..{MAX_DRAFT_TOKENS}); needs --draft")


def add_deferral_argument(sub: argparse.ArgumentParser) -> None:
    """--defer-experts D: expert deferral (docs/session.md), on either engine."""
    sub.add_argument("--defer-experts", type=int, default=0, metavar="D",
                     help="of each layer's routed experts, apply the D lightest one layer late so the CPU pool "
                          "computes them while the GPU runs the next layer: faster decoding, no longer exact "
                          "(0: exact; below the model's routed experts per token)")


def add_placement_arguments(sub: argparse.ArgumentParser, action: type[argparse.Action] | str = "store") -> None:
    """Where the gpu engine puts the routed experts: the VRAM cache's budget and a cap on VRAM."""
    sub.add_argument("--expert-cache", default=DEFAULT_EXPERT_CACHE, action=action,
                     help="VRAM for routed experts (gpu engine): auto (what the GPU has free beside the session), "
                          "a size such as 24G, or 0 (every routed expert on the CPU)")
    sub.add_argument("--cache-policy", choices=["lfru", "static"], default=DEFAULT_CACHE_POLICY, action=action,
                     help="whether routing replaces the experts a partial cache holds (lfru) or not (static)")
    sub.add_argument("--vram-limit", default=None, action=action,
                     help="cap the VRAM the model and its session take, as on a smaller card (e.g. 16G)")
    sub.add_argument("--ram-budget", default="auto", action=action, metavar="SIZE",
                     help="host RAM the model may keep (gpu engine): auto (what the machine can spare) or a size "
                          "such as 16G; routed experts beyond it are read from the file as decoding routes them "
                          "(docs/tiers.md)")


def add_arguments(sub: argparse.ArgumentParser) -> None:
    """The engine's arguments, then those of one answer: its length and sampling."""
    add_engine_arguments(sub)
    sub.add_argument("-n", "--max-tokens", "--n-predict", type=int, default=128,
                     help="tokens per answer at most (0 or -1: until EOS)")
    sub.add_argument("--temperature", "--temp", type=float, default=0.0, help="0: greedy")
    sub.add_argument("--top-k", type=int, default=0, help="0: off")
    sub.add_argument("--top-p", type=float, default=1.0)
    sub.add_argument("--min-p", type=float, default=0.0)
    sub.add_argument("--repeat-penalty", type=float, default=1.0, help="1: off")
    sub.add_argument("--seed", type=int, default=-1, help="the sampler's seed (-1: a random one)")
    sub.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    add_structured_arguments(sub)


def add_structured_arguments(sub: argparse.ArgumentParser) -> None:
    """--json-schema FILE and --grammar FILE: the answer held to a JSON schema or a GBNF grammar (structured
    output, docs/structured.md; llama.cpp's --json-schema-file and --grammar-file are the same flags)."""
    given = sub.add_mutually_exclusive_group()
    given.add_argument("--json-schema", "--json-schema-file", dest="json_schema", metavar="FILE", default=None,
                       help="hold every answer to the JSON schema in FILE (needs strata-moe[structured]; the reference "
                            "engine, for now)")
    given.add_argument("--grammar", "--grammar-file", dest="grammar", metavar="FILE", default=None,
                       help="hold every answer to the GBNF grammar in FILE, as llama.cpp reads it (needs "
                            "strata-moe[structured]; the reference engine, for now)")


def structured(args: argparse.Namespace) -> dict:
    """The constraint --json-schema or --grammar gives (Session's json_schema or grammar option), its file read and
    checked before the model loads: a file that is not there, not JSON or not a grammar is one line naming the
    flag."""
    from strata.chat_templates import read_user_text
    from strata.generation.constraints import check_source

    for option, flag, kind in (("json_schema", "--json-schema", "json_schema"), ("grammar", "--grammar", "gbnf")):
        path = getattr(args, option, None)
        if path is None:
            continue
        text = read_user_text(path, flag, MAX_GRAMMAR_BYTES)  # a schema as its JSON text: Session reads it so
        try:
            check_source(kind, text, option)
        except InvalidArgument as error:
            raise InvalidArgument(f"{flag} {path}: {str(error).removeprefix(option + ': ')}") from None
        return {option: text}
    return {}


def sampling(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repeat_penalty": args.repeat_penalty, "seed": args.seed, "stop": args.stop,
            "max_tokens": args.max_tokens if args.max_tokens > 0 else None, **getattr(args, "structured", {})}


def check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot say, in the command line's words (InvalidArgument): the model given once (args.model
    is then it, whichever way it came), and a flag that only modifies another not given without it."""
    named = {getattr(args, "model", None), args.model_option} - {None}
    if not named:
        raise InvalidArgument(f"name the model file: strata {args.command} MODEL (or -m MODEL)")
    if len(named) > 1:
        raise InvalidArgument(f"two model files named ({args.model} and -m {args.model_option}): give one")
    args.model = named.pop()
    if "draft_tokens" in getattr(args, "given", ()):
        if args.draft is None:
            raise InvalidArgument("--draft-tokens sets how many --draft drafts: give --draft too (lookup, mtp or "
                                  "auto)")
        checked_draft_tokens(args.draft_tokens, "--draft-tokens")
    if args.control_vector_layer_range is not None and not (args.control_vector or args.control_vector_scaled):
        raise InvalidArgument("--control-vector-layer-range sets the layers a control vector steers: give "
                              "--control-vector or --control-vector-scaled too")
    args.structured = structured(args)


def require_gpu(hint: str) -> None:
    """A one-line StrataError, with `hint`, where no CUDA device (or no native extension) is present."""
    try:
        from strata.devices import device_count

        count = device_count()
    except ImportError as error:
        raise StrataError(f"the native extension strata._native is not available ({error}); {hint}") from None
    if count == 0:
        raise StrataError(f"no CUDA device found (no NVIDIA driver or GPU); {hint}")


def warn_ignored(args: argparse.Namespace) -> None:
    ignored = sorted(getattr(args, "given", set()) & set(GPU_ONLY)) if args.engine == "reference" else []
    if ignored:
        names = ", ".join(f"--{name}" for name in ignored)
        print(f"strata {args.command}: {names} ignored: the reference engine has no use for it", file=sys.stderr)


def placement(args: argparse.Namespace) -> dict:
    """strata.load's options for the gpu engine from the command line."""
    return {"progress": True, "expert_cache": args.expert_cache, "cache_policy": args.cache_policy,
            "vram_limit": args.vram_limit, "ram_budget": args.ram_budget}


@contextmanager
def opened_model(args: argparse.Namespace) -> Iterator:
    """The model of `--engine` on the file, closed on exit."""
    from strata.api import load

    check_arguments(args)
    warn_ignored(args)
    if args.engine == "gpu":
        require_gpu("use --engine reference to run a small model on the CPU")
    options = placement(args) if args.engine == "gpu" else {}
    with load(args.model, engine=args.engine, **options) as model:
        yield model


def new_session(model, args: argparse.Namespace):
    """A Session on `model` of `--context` tokens with `--defer-experts`, `--draft`, `--draft-tokens` and the
    control vectors (and, on the gpu engine, `--kv`, `--kv-streaming` and `--mode`)."""
    options = {"defer_experts": args.defer_experts, "draft": args.draft, "draft_tokens": args.draft_tokens,
               **control_vectors(args)}
    if args.engine != "gpu":
        return model.session(args.context, **options)
    return model.session(args.context, kv=args.kv, mode=args.mode, kv_streaming=args.kv_streaming, **options)


@contextmanager
def opened(args: argparse.Namespace) -> Iterator:
    """The Session of `--engine` on the model file, closed (with its model) on exit."""
    with opened_model(args) as model:
        session = new_session(model, args)
        try:
            yield session
        finally:
            session.close()
