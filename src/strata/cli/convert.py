"""`strata convert`: a transformers checkpoint directory to a GGUF in llama.cpp's layout."""

from __future__ import annotations

import argparse

from strata.cli.help import ShowDefaults


def register(commands) -> None:
    sub = commands.add_parser("convert", help="a transformers checkpoint directory -> GGUF (llama.cpp layout)",
                              formatter_class=ShowDefaults)
    sub.add_argument("hf_dir", help="directory written by save_pretrained (config.json + *.safetensors)")
    sub.add_argument("out", help="the .gguf file to write (a new name, or a regular file with --force; a "
                                 "symbolic link, FIFO or device is refused)")
    sub.add_argument("--force", action="store_true", help="replace the file at OUT if there is one")
    sub.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    sub.add_argument("--mtp", action="store_true",
                     help="also write the checkpoint's MTP block (mtp.*) in llama.cpp's layout, for --draft mtp")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.convert import convert
    from strata.progress import ByteProgress

    print(convert(args.hf_dir, args.out, outtype=args.outtype, progress=ByteProgress("convert"),
                  overwrite=args.force, mtp=args.mtp))
    return 0
