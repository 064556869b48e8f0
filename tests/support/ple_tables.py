"""Stand-ins for the PLE layer's n-gram table: a ModelFile holding only the table, in any GGUF type, and token
sequences whose EOS ids cut the n-gram context (tests/runtime/test_engine.py, tests/session/test_ple_gather.py)."""

from __future__ import annotations

import os
import tempfile
import weakref
from types import SimpleNamespace

import gguf
import numpy as np

from strata.runtime.ple_rows import TABLE

# Bytes before the table in the stand-in's file: the table's rows start off any alignment, as in a GGUF.
TABLE_OFFSET = 100


class TableFile:
    """A ModelFile as PleRows reads one: its path, data section and tensors. The file (the table behind
    TABLE_OFFSET bytes of junk) is removed once the stand-in is dropped; readers that opened it keep reading."""

    def __init__(self, raw: np.ndarray, info: SimpleNamespace):
        descriptor, self.path = tempfile.mkstemp(suffix=".gguf", prefix="ple-table-")
        with os.fdopen(descriptor, "wb") as out:
            out.write(b"\xa5" * TABLE_OFFSET + raw.tobytes())
        weakref.finalize(self, os.unlink, self.path)
        self.data_start = 0
        self.tensors = {TABLE: info}


def table_file(g, ggml_type, rng: np.random.Generator, spread: float = 0.0):
    """A stand-in ModelFile holding only the n-gram table of `g` in `ggml_type`, and its float values. `spread`:
    rows scaled by 10^uniform(-spread, spread / 2), so a 16-bit type's subnormals and overflow (and a Q8_0 row's
    subnormal scale) appear too."""
    values = rng.standard_normal((g.ple_rows, g.ple_head_dim), dtype=np.float32)
    if spread:
        values *= (10.0 ** rng.uniform(-spread, spread / 2, (g.ple_rows, 1))).astype(np.float32)
    with np.errstate(over="ignore"):  # f16 turns the largest values into inf, as a converter would
        encoded = gguf.quants.quantize(values, ggml_type)
        floats = gguf.quants.dequantize(encoded, ggml_type).reshape(g.ple_rows, g.ple_head_dim)
    raw = np.ascontiguousarray(encoded).view(np.uint8).reshape(-1)  # the file's bytes
    info = SimpleNamespace(ne=(g.ple_head_dim, g.ple_rows), ggml_type=ggml_type, nbytes=raw.nbytes,
                           offset=TABLE_OFFSET)
    return TableFile(raw, info), floats


def ids_with_eos(g, rng: np.random.Generator, n: int = 12) -> list[int]:
    """n random ids of g's vocabulary with an EOS alone (at 3) and two in a row (7, 8): both cut the context."""
    ids = [int(t) for t in rng.integers(0, g.n_vocab, n)]
    ids[3] = ids[7] = ids[8] = g.ple_eos
    return ids
