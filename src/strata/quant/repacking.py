"""repack: GGUF tensor bytes -> a canonical form, bit-exactly, in row chunks spread over a thread pool."""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from strata.errors import FormatError, InvalidArgument
from strata.quant.forms import FLOAT_DTYPES, form_for
from strata.quant.repack_kernels import KERNELS
from strata.quant.repack_lattice import LATTICE_KERNELS
from strata.quant.tensor import QuantTensor

# Input bytes per task: large enough that numpy's per-call overhead is noise, small enough that a
# task's temporaries stay in the core's L2 and that big tensors split over every thread.
CHUNK_BYTES = 1 << 20


# Measured on the 16-core GPU box (benchmarks/bench_repack.py): Q4_K 3.28 GB/s with 8 threads, 1.90 with 16;
# past 8 the numpy temporaries fight over memory bandwidth and the K types slow down.
MAX_DEFAULT_THREADS = 8
_KERNELS = {**KERNELS, **LATTICE_KERNELS}


def default_threads() -> int:
    """Cores this process may run on, at most MAX_DEFAULT_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores, MAX_DEFAULT_THREADS)


@functools.lru_cache(maxsize=None)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="strata-repack")


def rows_cols(ne: Sequence[int], what: str = "tensor") -> tuple[int, int]:
    """ggml ``ne`` (ne0 fastest) -> (rows, cols): cols = ne0, rows = the product of the others."""
    if not ne or any(int(n) < 1 for n in ne):
        raise FormatError(f"{what}: ne must be a non-empty list of positive sizes; found {list(ne)}")
    return math.prod(int(n) for n in ne[1:]), int(ne[0])


def repack(raw: np.ndarray, ggml_type: T | int, ne: Sequence[int], *, threads: int | None = None,
           name: str = "tensor") -> QuantTensor | np.ndarray:
    """The canonical form of a GGUF tensor from its raw bytes.

    Float types give a ``[rows, cols]`` view of ``raw`` (bf16 as its uint16 bits); quantized types a
    QuantTensor with freshly allocated planes. ``threads`` defaults to every core this process may use.
    """
    form = form_for(ggml_type)
    ggml_type = T(ggml_type)
    rows, cols = rows_cols(ne, name)
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if cols % block_size:
        raise FormatError(f"{name}: {ggml_type.name} rows of ne0={cols} elements are not whole blocks of {block_size}")
    n_blocks = rows * cols // block_size
    raw = _as_bytes(raw, n_blocks * type_size, name, ggml_type)
    if form.is_float:
        return raw.view(FLOAT_DTYPES[form.float_kind]).reshape(rows, cols)

    out = QuantTensor.empty(form, rows, cols)
    blocks = raw.reshape(n_blocks, type_size)
    # Every plane is row-major with a whole number of entries per GGUF block, so a flat block range
    # of the input maps to the same block range of each plane.
    per_block = {plane: array.reshape(n_blocks, -1) for plane, array in out.planes().items()}
    step = max(1, CHUNK_BYTES // type_size)
    spans = [(start, min(start + step, n_blocks)) for start in range(0, n_blocks, step)]
    kernel = _KERNELS[ggml_type]

    def run(span: tuple[int, int]) -> None:
        lo, hi = span
        kernel(blocks[lo:hi], {plane: array[lo:hi] for plane, array in per_block.items()})

    threads = default_threads() if threads is None else threads
    if threads < 1:
        raise InvalidArgument(f"repack threads must be >= 1; found {threads}")
    if threads == 1 or len(spans) == 1:
        for span in spans:
            run(span)
    else:
        for _ in _pool(threads).map(run, spans):  # consume, so a kernel's exception surfaces here
            pass
    return out


def _as_bytes(raw: np.ndarray, expected: int, name: str, ggml_type: T) -> np.ndarray:
    raw = np.asarray(raw)
    if not raw.flags.c_contiguous:
        raise InvalidArgument(f"{name}: raw bytes must be C-contiguous")
    raw = raw.reshape(-1).view(np.uint8)
    if raw.size != expected:
        raise FormatError(f"{name}: {ggml_type.name} data is {raw.size} bytes, expected {expected}")
    return raw

