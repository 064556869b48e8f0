"""`strata cvector`: a control vector from prompt pairs, written as llama.cpp's cvector-generator writes one
(docs/control_vectors.md), for `--control-vector` here or in llama.cpp."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from strata.cli.help import ShowDefaults
from strata.errors import InvalidArgument

MAX_PROMPTS_BYTES = 16 << 20  # a prompts file larger is refused before it is read whole


def register(commands) -> None:
    sub = commands.add_parser("cvector", help="make a control vector from positive and negative prompts",
                              formatter_class=ShowDefaults,
                              description="Each layer's last-token hidden state on every positive prompt minus "
                                          "that on its negative pair (line N of each file), reduced to one unit "
                                          "vector per layer: their mean, or their first principal component.")
    sub.add_argument("model", help="path of a .gguf model file")
    sub.add_argument("--positive", required=True, metavar="FILE", help="positive prompts, one per line")
    sub.add_argument("--negative", required=True, metavar="FILE", help="negative prompts, paired by line")
    sub.add_argument("-o", "--output", required=True, metavar="OUT", help="the control-vector .gguf to write")
    sub.add_argument("--force", action="store_true", help="replace the file at OUT if there is one")
    sub.add_argument("--method", choices=["mean", "pca"], default="mean",
                     help="mean of the differences, or their first principal component")
    sub.add_argument("--engine", choices=["auto", "gpu", "reference"], default="auto",
                     help="the engine whose hidden states are measured: the GPU's prompt path (one pass per prompt), "
                          "the numpy reference (exact, slow), or auto: the GPU where a CUDA device is present")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.control_vectors import prompt_pairs
    from strata.convert.output_path import check_target

    pairs = prompt_pairs(_lines(args.positive, "--positive"), _lines(args.negative, "--negative"))
    check_target(Path(args.output), args.force)
    engine = _engine(args.engine)
    print(f"strata cvector: engine {engine}", file=sys.stderr, flush=True)
    if engine == "gpu":
        _on_gpu(args, pairs)
    else:
        _on_reference(args, pairs)
    print(args.output)
    return 0


def _engine(asked: str) -> str:
    """The engine `--engine` names; auto: the GPU where a CUDA device (and the native extension) is present."""
    if asked != "auto":
        return asked
    try:
        from strata.devices import device_count

        return "gpu" if device_count() > 0 else "reference"
    except ImportError:
        return "reference"


def _on_reference(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> None:
    from strata.control_vectors import make_control_vector, write_control_vector
    from strata.format import inspect
    from strata.reference import Reference

    with inspect(args.model) as model_file:
        directions = make_control_vector(Reference(model_file), model_file.tokenizer(), pairs, args.method,
                                         progress=_PromptProgress())
        write_control_vector(args.output, directions, model_file.geometry.arch)


def _on_gpu(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> None:
    """Each prompt through the GPU's prompt path once, each layer's output at its last token recorded on the way
    (GpuEngine.layer_states), in a session of bf16 KV that holds the longest prompt."""
    from strata.api import load
    from strata.cli.session import require_gpu
    from strata.control_vectors import make_control_vector, write_control_vector

    require_gpu("use --engine reference to measure on the numpy reference")
    with load(args.model, engine="gpu") as model:
        tokenizer, g = model.tokenizer, model.info.geometry
        longest = max(len(tokenizer.encode(prompt, special=True)) for pair in pairs for prompt in pair)
        if longest > g.context_length:
            raise InvalidArgument(f"a prompt of {longest} tokens is longer than the model's context of "
                                  f"{g.context_length}")
        with model.session(max(longest, 1), kv="bf16", snapshots=0) as session:
            engine = session.engine
            if not engine.prompt_chunk:
                raise InvalidArgument("strata cvector on the GPU measures on the prompt path, which this load has "
                                      "not (its staging did not fit); use --engine reference")
            directions = make_control_vector(engine.layer_states, tokenizer, pairs, args.method,
                                             progress=_PromptProgress())
        write_control_vector(args.output, directions, g.arch)


class _PromptProgress:
    """A line on stderr as prompts run, with the time so far: after every prompt that ends a second or more after
    the last line (each takes seconds to minutes on the reference, milliseconds on the GPU), and after the last."""

    def __init__(self) -> None:
        self.start = self.said = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.said < 1.0 and done > 1:
            return
        self.said = now
        print(f"strata cvector: {done} of {total} prompts run ({now - self.start:.1f} s)", file=sys.stderr,
              flush=True)


def _lines(path: str, option: str) -> list[str]:
    from strata.chat_templates import read_user_text

    return read_user_text(path, option, MAX_PROMPTS_BYTES).splitlines()
