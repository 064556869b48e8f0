"""What `strata serve` and `strata chat` share about the chat template: --chat-template (a built-in's name or
Jinja text) and --chat-template-file, read and checked before the model loads, and put in place of the model
file's template on the sessions."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from strata.chat_templates import BUILT_IN, chosen_template


def add_arguments(sub: argparse.ArgumentParser) -> None:
    given = sub.add_mutually_exclusive_group()
    given.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                       help=f"the chat template to use instead of the model file's: a built-in "
                            f"({', '.join(BUILT_IN)}) or Jinja text")
    given.add_argument("--chat-template-file", default=None, metavar="PATH",
                       help="the chat template to use instead of the model file's, read from a file of Jinja text")


def chosen(args: argparse.Namespace) -> str | None:
    """The template the options give (None: the model file's); InvalidArgument names a bad one."""
    return chosen_template(args.chat_template, args.chat_template_file)


def install(template: str | None, sessions: Sequence) -> bool:
    """Put `template` (unless None) in place of the model file's on every session; whether they have one now."""
    for session in sessions:
        if template is not None:
            session.codec.chat_template = template
    return all(getattr(session.codec, "chat_template", None) for session in sessions)
