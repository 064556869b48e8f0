"""What the benchmarks hand back: each line to the caller's `emit`, and the numbers as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Emit = Callable[[str], None]  # takes one line of a report (print, list.append, a logger)


def write_json(path: str, record: Any) -> None:
    """`record` (dicts, lists, numbers, strings) as indented JSON at `path`."""
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
