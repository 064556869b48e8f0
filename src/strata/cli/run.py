"""`strata run`: text from a prompt, streamed."""

from __future__ import annotations

import argparse
import sys

from strata.cli import session
from strata.cli.help import ShowDefaults

INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C


def register(commands) -> None:
    sub = commands.add_parser("run", help="generate text from a prompt, streamed",
                              formatter_class=ShowDefaults)
    sub.add_argument("-p", "--prompt", required=True)
    session.add_arguments(sub)
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    interrupted = False
    with session.opened(args) as opened:
        try:
            for piece in opened.generate(args.prompt, **session.sampling(args)):
                print(piece.text, end="", flush=True)
        except KeyboardInterrupt:  # at a token boundary, or while a piece was printed: the answer ends there
            interrupted = True
        print()
        stats = opened.stats
        engine = args.engine if args.engine == "reference" else f"{args.engine} ({args.mode}, kv {args.kv})"
        print(f"[{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.2f} tok/s decode, "
              f"prompt {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s, "
              f"ended by {'interrupted' if interrupted else stats.finish_reason}; engine: {engine}"
              f"{drafted(stats) if args.draft else ''}]", file=sys.stderr)
    return INTERRUPTED if interrupted else 0


def drafted(stats) -> str:
    """The summary's drafting part: acceptance and tokens per engine step."""
    return (f"; drafts: {stats.accepted} of {stats.drafted} accepted ({stats.acceptance_rate:.0%}), "
            f"{stats.tokens_per_step:.2f} tokens per step")
