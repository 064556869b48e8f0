"""`strata run`: text from a prompt (-p, -p - for standard input, or -f FILE), streamed."""

from __future__ import annotations

import argparse
import sys

from strata.cli import session
from strata.cli.help import ShowDefaults

INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C
MAX_PROMPT_BYTES = 16 << 20  # a prompt larger is refused before it is read whole (no context holds it)


def register(commands) -> None:
    sub = commands.add_parser("run", help="generate text from a prompt, streamed",
                              formatter_class=ShowDefaults)
    given = sub.add_mutually_exclusive_group(required=True)
    given.add_argument("-p", "--prompt", help="the prompt's text; - reads it from standard input")
    given.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE (UTF-8 text)")
    session.add_arguments(sub)
    sub.set_defaults(handler=handle)


def prompt_text(args: argparse.Namespace) -> str:
    """The prompt: -p's text, standard input for -p -, or -f's file (each at most MAX_PROMPT_BYTES)."""
    from strata.chat_templates import read_user_text
    from strata.errors import InvalidArgument

    if args.file is not None:
        return read_user_text(args.file, "-f", MAX_PROMPT_BYTES)
    if args.prompt != "-":
        return args.prompt
    text = sys.stdin.read(MAX_PROMPT_BYTES + 1)
    if len(text) > MAX_PROMPT_BYTES:
        raise InvalidArgument(f"-p -: the prompt on standard input is over {MAX_PROMPT_BYTES} characters")
    return text


def handle(args: argparse.Namespace) -> int:
    interrupted = False
    prompt = prompt_text(args)  # before the model loads: a prompt that cannot be read is said at once
    with session.opened(args) as opened:
        try:
            for piece in opened.generate(prompt, **session.sampling(args)):
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
