"""The `strata` command: one module per command, each adding its own parser (`register`) and handler (`handle`).

Command modules import only what their parsers need at module level, so `strata --help` and `strata doctor`
stay fast; the work each command does is imported by its handler.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import strata
from strata.cli import bench, bench_pool, chat, convert, cvector, doctor, info, run, serve, synth
from strata.errors import StrataError

COMMANDS = (doctor, info, convert, synth, run, chat, serve, bench, cvector)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata", description="Run very large Mixture-of-Experts models on one GPU plus the host."
    )
    parser.add_argument("--version", action="version", version=f"strata {strata.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "pool"]:
        # parsed apart from `strata bench [MODEL]`, whose optional MODEL argparse could not tell from a command
        return bench_pool.build_parser().parse_args(argv[2:])
    return build_parser().parse_args(argv)


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush of a closed pipe cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no descriptor behind stdout (a test's capture): nothing to do
        pass


# The library's argument names, where its errors reach the command line, as the command line spells them.
CLI_WORDS = {"draft_tokens": "--draft-tokens", "control_layers": "--control-vector-layer-range",
             "defer_experts": "--defer-experts", "expert_cache": "--expert-cache", "cache_policy": "--cache-policy",
             "vram_limit": "--vram-limit", "kv_streaming": "--kv-streaming", "control_vectors": "--control-vector",
             "ram_budget": "--ram-budget"}
_API_NAMES = re.compile(r"\b(" + "|".join(CLI_WORDS) + r")\b")


def in_cli_words(message: str) -> str:
    """An error of the library said as the command line has it: its arguments named by their flags."""
    return _API_NAMES.sub(lambda match: CLI_WORDS[match.group(1)], message.replace(" (overwrite=True)", ""))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.handler(args)
    except StrataError as error:
        print(f"strata {args.command}: {in_cli_words(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"strata {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`strata run ... | head`): nothing more can be written to it
        _discard_stdout()
        print(f"strata {args.command}: the output was closed before the end", file=sys.stderr)
        return 1
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        print(f"strata {args.command}: {error.strerror or error}{where}", file=sys.stderr)
        return 1
