"""Progress of long work (load, repack, convert, synth) on stderr: a live line on a terminal, a line per 10%
otherwise (logs stay short)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

GB = 1e9


class ByteProgress:
    """A callable(done_bytes, total_bytes) that reports what `label` has done so far."""

    def __init__(self, label: str, stream: TextIO | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.start = time.monotonic()
        self.last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        seconds = max(time.monotonic() - self.start, 1e-9)
        text = f"{self.label}: {done / GB:.2f} / {total / GB:.2f} GB ({fraction:.0%}, {done / GB / seconds:.2f} GB/s)"
        if self.live:
            self.stream.write("\r" + text + ("\n" if done >= total else ""))
            self.stream.flush()
            return
        decile = int(fraction * 10)
        if decile > self.last_decile:
            self.last_decile = decile
            self.stream.write(text + "\n")
