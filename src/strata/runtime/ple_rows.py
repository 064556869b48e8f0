"""The n-gram table rows of each new token for the GPU engine's PLE layer (docs/models/qwen4exp.md §3(d)).

The table (per_layer_token_embd, ~320M rows in the released model) never needs RAM: per token only its
ple_n_heads hashed rows are read from the file, with a small cache of the rows read last (strata._native.FileRows,
docs/tiers.md), dequantized on the host and handed to the session.
The hash and the EOS cut are strata.reference.ple's, so the GPU engine reads exactly the rows the reference does;
the runtime runs them in one place, the native core's strata::PleNgrams (strata/ple_gather.hpp), which picks the
rows here too. For the table types a converter writes (NATIVE_ROW_TYPES) the decode session runs the whole gather
natively on its host loop (`PleRows.native`); this path reads and dequantizes the rows of every other type.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native
from strata.errors import FormatError, InvalidArgument
from strata.models import Geometry
from strata.quant import dequantize_raw

TABLE = "per_layer_token_embd.weight"
# Rows each reader keeps: a few hundred tokens' rows (qwen4exp: 16 rows of 170 bytes a token, 0.7 MB).
CACHE_ROWS = 4096
# The table types the native gather reads, as strata._native.PleGather names them.
NATIVE_ROW_TYPES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q8_0: "q8_0"}


class PleRows:
    """Keeps the last ngram-1 ids (EOS before the sequence, in `ngrams`: a strata._native.PleNgrams) and gathers
    each new token's table rows."""

    def __init__(self, model_file, geometry: Geometry):
        if geometry.ple is None:
            raise InvalidArgument(f"geometry of {geometry.arch!r} has no PLE layer (its ple.layers is empty)")
        self.shape = geometry.ple
        info = model_file.tensors.get(TABLE)
        if info is None:
            raise FormatError(f"{model_file.path}: no tensor {TABLE!r}, required by the PLE layer "
                              f"{geometry.ple_layers[0]}")
        width, n_rows = int(info.ne[0]), int(info.ne[-1])
        if width != self.shape.head_dim or len(info.ne) != 2:
            raise FormatError(f"{TABLE}: ne {tuple(info.ne)}, expected ({self.shape.head_dim}, rows)")
        self.ggml_type = info.ggml_type
        # Where its rows lie: each reader (this one, and a native gather's) reads them as needed.
        self.where = (str(model_file.path), model_file.data_start + info.offset, n_rows, info.nbytes // n_rows)
        self.table = self.reader()
        self.n_heads = self.shape.n_heads
        self.ngrams = _native.PleNgrams(self.shape)

    def reset(self) -> None:
        """An empty sequence: the ids before it read as EOS."""
        self.ngrams.reset()

    @property
    def previous(self) -> np.ndarray:
        """int64 [ngram - 1]: the last ids seen, oldest first (what a state snapshot keeps and restores)."""
        return self.ngrams.previous

    @previous.setter
    def previous(self, ids) -> None:
        self.ngrams.previous = ids

    def reader(self) -> _native.FileRows:
        """A reader of the table's rows with a cache of its own."""
        return _native.FileRows(*self.where, cache_rows=CACHE_ROWS, what=TABLE)

    def native(self) -> _native.PleGather | None:
        """The same gather in the native core, from the ids seen so far, for a decode session to run on its host
        loop (it keeps the state from then on, and reads through a reader of its own); None for a table type it
        does not read, which stays here."""
        row_type = NATIVE_ROW_TYPES.get(self.ggml_type)
        if row_type is None:
            return None
        gather = _native.PleGather(self.reader(), row_type, self.shape)
        gather.previous = self.previous
        return gather

    def rows(self, token: int) -> np.ndarray:
        """float32 [ple_n_heads, ple_head_dim]: the rows of `token` appended after the ids seen so far."""
        index = self.ngrams.indices(token)
        return dequantize_raw(self.table.gather(index), self.ggml_type, (self.shape.head_dim, self.n_heads))

    def rows_for(self, tokens) -> np.ndarray:
        """float32 [len(tokens), ple_n_heads, ple_head_dim]: the rows of each token appended in turn, as rows()
        token by token gives them, in one gather (a prompt's thousands of tokens would wait on a Python loop)."""
        index = self.ngrams.indices_for(tokens)
        rows = dequantize_raw(self.table.gather(index.reshape(-1)), self.ggml_type, (self.shape.head_dim, index.size))
        return rows.reshape(index.shape[0], self.n_heads, self.shape.head_dim)
