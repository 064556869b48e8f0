"""`strata synth`: a GGUF with well-formed random weights, of any geometry."""

from __future__ import annotations

import argparse
import sys

from strata.cli.help import ShowDefaults
from strata.models import ARCHITECTURES

TENSOR_CLASSES = ("experts", "expert-down", "dense", "embeddings", "ple")


def register(commands) -> None:
    sub = commands.add_parser("synth", help="a GGUF with well-formed random weights, of any geometry",
                              formatter_class=ShowDefaults)
    sub.add_argument("out", help="the .gguf file to write (a new name, or a regular file with --force; a "
                                 "symbolic link, FIFO or device is refused)")
    sub.add_argument("--force", action="store_true", help="replace the file at OUT if there is one")
    sub.add_argument("--arch", default="qwen4exp", choices=list(ARCHITECTURES))
    sub.add_argument("--preset", default="tiny", choices=["tiny", "bench", "full"])
    sub.add_argument("--layers", type=int, default=None, help="layer count (default: the preset's)")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--full-ple", action="store_true", help="the released n-gram table size (full preset)")
    sub.add_argument("--mtp", action="store_true",
                     help="also write an MTP block in llama.cpp's layout (every architecture), for --draft mtp on "
                          "the reference engine")
    for name in TENSOR_CLASSES:
        sub.add_argument(f"--{name}-type", default=None, metavar="TYPE", help=f"GGML type of the {name} tensors")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.progress import ByteProgress
    from strata.synth import synthesize
    from strata.synth.presets import default_types

    types = {name.replace("-", "_"): getattr(args, f"{name.replace('-', '_')}_type") for name in TENSOR_CLASSES}
    types = {name: value for name, value in types.items() if value}
    if types:
        types = {**vars(default_types(args.preset)), **types}
    out = synthesize(args.out, args.arch, preset=args.preset, n_layer=args.layers, types=types or None,
                     seed=args.seed, progress=ByteProgress("synth"), full_ple=args.full_ple, overwrite=args.force,
                     mtp=args.mtp, notice=lambda line: print(f"strata synth: {line}", file=sys.stderr))
    print(out)
    return 0
