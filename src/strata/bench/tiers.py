"""The disk tier's side of a bench (docs/tiers.md): the file's read rate measured with the tier's own kind of reads,
the tier's counters, and the limit of a tiered load's token, whose missed experts come from the file."""

from __future__ import annotations

import errno
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.bench.limit import Limit
from strata.runtime.tiers import IO_THREADS, file_matrices, matrix_file_bytes

ALIGN = 4096  # O_DIRECT's alignment of offsets, lengths and buffers


@dataclass(frozen=True)
class DiskRate:
    bytes_per_second: float
    reads: str  # "O_DIRECT", or "buffered" where the file system refuses it (tmpfs): as the tier then reads


def expert_spans(file: Any) -> list[tuple[int, int]]:
    """(offset, length) of every matrix of every routed expert in `file` (strata.format's ModelFile): what the
    tier reads."""
    g = file.geometry
    spans = []
    for layer in range(g.n_layer):
        for m in file_matrices(file, layer) or ():
            spans += [(m.offset + e * m.stride, matrix_file_bytes(m)) for e in range(g.n_expert)]
    return spans


def disk_rate(path: str, spans: list[tuple[int, int]], seconds: float = 4.0, threads: int = IO_THREADS) -> DiskRate:
    """The rate of reads of `spans` picked at random, `threads` in flight for `seconds`: O_DIRECT, 4 KiB aligned,
    as the tier reads, or buffered where the file system refuses O_DIRECT."""
    if not spans:
        raise ValueError("no routed expert in the file to read")
    try:
        fd, reads = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)), "O_DIRECT"
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        fd, reads = os.open(path, os.O_RDONLY), "buffered"
    rng = np.random.default_rng()
    deadline = time.monotonic() + seconds

    def reader(seed: int) -> int:
        picks = np.random.default_rng(seed)
        longest = max(length for _, length in spans) + 2 * ALIGN
        buffer = mmap.mmap(-1, longest)  # page-aligned, as O_DIRECT wants
        done = 0
        while time.monotonic() < deadline:
            offset, length = spans[int(picks.integers(len(spans)))]
            start = offset // ALIGN * ALIGN
            size = (offset + length + ALIGN - 1) // ALIGN * ALIGN - start
            done += os.preadv(fd, [memoryview(buffer)[:size]], start)
        return done

    try:
        start = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(reader, rng.integers(1 << 31, size=threads)))
        return DiskRate(total / (time.monotonic() - start), reads)
    finally:
        os.close(fd)


def tier_counts(pool: Any) -> tuple[int, int, int]:
    """(hits, misses, bytes read) over every tiered layer of `pool` (strata.runtime.pool.ExpertPool) so far."""
    stats = pool.tier_stats()
    return (sum(s["hits"] for s in stats), sum(s["misses"] for s in stats), sum(s["bytes_read"] for s in stats))


def tiered_limit(limit: Limit, before: tuple[int, int, int], after: tuple[int, int, int], steps: int,
                 disk: DiskRate) -> dict[str, float]:
    """The limit of a tiered load's token over `steps` tokens between the tier's counts `before` and `after`: the
    routed bytes the pool found in its arena at the host read rate, the bytes it read from the file at `disk`'s
    rate, and the dense (and cached) bytes and the doorbells as `limit` has them."""
    hits, misses, read = (a - b for a, b in zip(after, before))
    missed = misses / max(hits + misses, 1)
    disk_seconds = read / steps / disk.bytes_per_second
    seconds = (1 - missed) * limit.routed_seconds + disk_seconds + limit.dense_seconds + limit.doorbell_seconds
    return {"seconds": seconds, "misses_per_token": misses / steps, "disk_bytes_per_token": read / steps,
            "disk_seconds": disk_seconds, "missed_share": missed, "disk_rate": disk.bytes_per_second,
            "disk_reads": disk.reads}
