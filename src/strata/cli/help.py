"""The commands' help: each option's default shown once, and only where it says something."""

from __future__ import annotations

import argparse


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except where the help already states the default or there is none (None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)
