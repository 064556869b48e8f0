"""`strata cvector`: a control vector from prompt pairs, written as llama.cpp's cvector-generator writes one
(docs/control_vectors.md), for `--control-vector` here or in llama.cpp."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from strata.cli.help import ShowDefaults

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
    sub.add_argument("--engine", choices=["reference"], default="reference",
                     help="the engine whose hidden states are measured (the numpy reference, for now)")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.control_vectors import make_control_vector, prompt_pairs, write_control_vector
    from strata.convert.output_path import check_target
    from strata.format import inspect
    from strata.reference import Reference

    pairs = prompt_pairs(_lines(args.positive, "--positive"), _lines(args.negative, "--negative"))
    check_target(Path(args.output), args.force)
    with inspect(args.model) as model_file:
        directions = make_control_vector(Reference(model_file), model_file.tokenizer(), pairs, args.method,
                                         progress=_PromptProgress())
        write_control_vector(args.output, directions, model_file.geometry.arch)
    print(args.output)
    return 0


class _PromptProgress:
    """A line on stderr per prompt run (each takes seconds to minutes on the reference), with the time so far."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        print(f"strata cvector: {done} of {total} prompts run ({time.monotonic() - self.start:.1f} s)",
              file=sys.stderr, flush=True)


def _lines(path: str, option: str) -> list[str]:
    from strata.chat_templates import read_user_text

    return read_user_text(path, option, MAX_PROMPTS_BYTES).splitlines()
