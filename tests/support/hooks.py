"""The test hooks, strata._native_check: development installs build them (STRATA_CHECKS), wheels never.

A test that calls them carries the `hooks` marker, and tests/conftest.py skips it where they are absent, as it
skips a `gpu` test without a device. Test modules take the extension from here (`from support.hooks import
native_check`), not with an import of their own, which would fail their collection where it is absent.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest

ABSENT = "no test hooks (strata._native_check): only development installs build them, `pip install -e .`"


def available() -> bool:
    return importlib.util.find_spec("strata._native_check") is not None


class _Absent:
    """Stands in for the extension where it is not built. The marker skips a test before it starts; a test
    that reaches a hook without it skips there, for the same reason, rather than fail on a missing module."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # what collection asks of every module-level name (is it a class?)
            raise AttributeError(name)
        pytest.skip(f"{ABSENT}: {name} needs them")


native_check: ModuleType | _Absent = importlib.import_module("strata._native_check") if available() else _Absent()
