"""Typed, validated access to GGUF metadata given as plain Python values.

Every failure is a FormatError that names the key, what was expected and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from strata.errors import FormatError

_MISSING = object()


def fail(key: str, expected: str, found: Any) -> FormatError:
    """The one message shape of every metadata error."""
    text = repr(found)
    if len(text) > 120:
        text = text[:117] + "..."
    return FormatError(f"metadata key {key!r}: expected {expected}, found {text}")


def check(ok: bool, key: str, expected: str, found: Any) -> None:
    if not ok:
        raise fail(key, expected, found)


class MetadataReader:
    """Reads the `{arch}.*` keys of one file; `key("block_count")` is the full name."""

    def __init__(self, kv: Mapping[str, Any], arch: str):
        self.kv = kv
        self.arch = arch

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.key(suffix) in self.kv

    def _get(self, suffix: str, default: Any) -> tuple[str, Any]:
        key = self.key(suffix)
        value = self.kv.get(key, default)
        if value is _MISSING:
            raise FormatError(f"metadata key {key!r} is required for {self.arch} but missing")
        return key, value

    def int(self, suffix: str, *, minimum: int = 1, default: Any = _MISSING) -> int:
        key, value = self._get(suffix, default)
        check(_is_int(value), key, "an integer", value)
        check(value >= minimum, key, f"an integer >= {minimum}", value)
        return int(value)

    def float(self, suffix: str, *, default: Any = _MISSING) -> float:
        key, value = self._get(suffix, default)
        check(_is_int(value) or isinstance(value, float), key, "a number", value)
        check(math.isfinite(value), key, "a finite number", value)
        return float(value)

    def choice(self, suffix: str, choices: tuple[str, ...]) -> str:
        key, value = self._get(suffix, _MISSING)
        check(isinstance(value, str) and value in choices, key, f"one of {', '.join(map(repr, choices))}", value)
        return value

    def ints(self, suffix: str, *, length: int | None = None, minimum: int = 0,
             default: Any = _MISSING) -> tuple[int, ...]:
        key, value = self._get(suffix, default)
        check(isinstance(value, Sequence) and not isinstance(value, (str, bytes)), key, "an array of integers",
              value)
        check(all(_is_int(v) for v in value), key, "an array of integers", value)
        if length is not None:
            check(len(value) == length, key, f"an array of {length} integers", f"{len(value)} entries")
        bad = [v for v in value if v < minimum]
        check(not bad, key, f"integers >= {minimum}", bad[:4])
        return tuple(int(v) for v in value)

    def bools(self, suffix: str, *, length: int) -> tuple[bool, ...]:
        key, value = self._get(suffix, _MISSING)
        check(isinstance(value, Sequence) and not isinstance(value, (str, bytes)), key, "an array of bools", value)
        check(all(isinstance(v, bool) for v in value), key, "an array of bools", value)
        check(len(value) == length, key, f"an array of {length} bools (one per layer)", f"{len(value)} entries")
        return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
