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
