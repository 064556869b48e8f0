"""Progress of long work (load, repack, convert, synth) on stderr: tqdm's live bar on a terminal; in a log
(not a terminal), where a live bar's carriage returns would pile up on one line, one line per 10 %."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def byte_text(n: float) -> str:
    """`n` bytes with the unit that suits it (decimal, as disks and rates are quoted)."""
    for size, unit in _UNITS:
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


class ByteProgress:
    """A callable(done_bytes, total_bytes) that reports what `label` has done so far, and ends at 100 % with a
    newline once done reaches the total."""

    def __init__(self, label: str, stream: TextIO | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.start = time.monotonic()
        self.last_decile = -1
        self.bar = None
        self.finished = False

    def __call__(self, done: int, total: int) -> None:
        if self.finished:
            return
        self.finished = done >= total
        if self.live:
            self._bar(done, total)
        else:
            self._log(done, total)

    def _bar(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, unit="B", unit_scale=True, unit_divisor=1000,
                            file=self.stream, dynamic_ncols=True, leave=True)
        self.bar.update(done - self.bar.n)
        if self.finished:
            self.bar.close()

    def _log(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        decile = int(fraction * 10)
        if decile > self.last_decile:
            self.last_decile = decile
            rate = done / max(time.monotonic() - self.start, 1e-9)
            self.stream.write(f"{self.label}: {byte_text(done)} of {byte_text(total)} ({fraction:.0%}, "
                              f"{byte_text(rate)}/s)\n")
            self.stream.flush()
