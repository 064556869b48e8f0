"""The n-gram table rows of each new token for the GPU engine's PLE layer (docs/models/qwen4exp.md §3(d)).

The table (per_layer_token_embd, ~320M rows in the released model) stays memory-mapped: per token only its
ple_n_heads hashed rows are read from the page cache, dequantized on the host and handed to the session.
The hash and the EOS cut are strata.reference.ple's, so the GPU engine reads exactly the rows the reference does.
For the table types a converter writes (NATIVE_ROW_TYPES) the decode session runs the same gather natively on its
host loop (`PleRows.native`, strata/ple_gather.hpp); this path serves every other type.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native
from strata.errors import FormatError, InvalidArgument
from strata.models import Geometry
from strata.quant import dequantize_raw

TABLE = "per_layer_token_embd.weight"
# The table types the native gather reads, as strata._native.PleGather names them.
NATIVE_ROW_TYPES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q8_0: "q8_0"}


class PleRows:
    """Keeps the last ngram-1 ids (EOS before the sequence) and gathers each new token's table rows."""

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
        # The raw bytes as [rows, bytes per row]: a row gather is one fancy index of the mapping.
        self.table = model_file.raw(TABLE).reshape(n_rows, info.nbytes // n_rows)
        self.n_heads = self.shape.n_heads
        self.reset()

    def reset(self) -> None:
        """An empty sequence: the ids before it read as EOS."""
        self.previous = np.full(self.shape.ngram - 1, self.shape.eos, dtype=np.int64)

    def native(self) -> _native.PleGather | None:
        """The same gather in the native core, from the ids seen so far, for a decode session to run on its host
        loop (it keeps the state from then on); None for a table type it does not read, which stays here."""
        row_type = NATIVE_ROW_TYPES.get(self.ggml_type)
        if row_type is None:
            return None
        gather = _native.PleGather(self.table, row_type, self.shape)
        gather.previous = self.previous
        return gather

    def rows(self, token: int) -> np.ndarray:
        """float32 [ple_n_heads, ple_head_dim]: the rows of `token` appended after the ids seen so far."""
        index = self.row_indices(token)
        return dequantize_raw(self.table[index], self.ggml_type, (self.shape.head_dim, self.n_heads))

    def rows_for(self, tokens) -> np.ndarray:
        """float32 [len(tokens), ple_n_heads, ple_head_dim]: the rows of each token appended in turn, as rows()
        token by token gives them, in one gather (a prompt's thousands of tokens would wait on a Python loop)."""
        index = self.indices_for(tokens)
        rows = dequantize_raw(self.table[index.reshape(-1)], self.ggml_type, (self.shape.head_dim, index.size))
        return rows.reshape(index.shape[0], self.n_heads, self.shape.head_dim)

    def indices_for(self, tokens) -> np.ndarray:
        """int64 [len(tokens), ple_n_heads]: row_indices of each token appended in turn, on uint64 arrays (whose
        products wrap modulo 2^64 as the hash's masked Python ints do)."""
        shape = self.shape
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        back = shape.ngram - 1
        seq = np.concatenate([self.previous, ids])
        context = [ids.astype(np.uint64)]
        cut = np.zeros(ids.size, dtype=bool)
        for s in range(1, shape.ngram):
            previous = seq[back - s: back - s + ids.size]
            cut |= previous == shape.eos
            context.append(np.where(cut, shape.eos, previous).astype(np.uint64))
        if back:
            self.previous = seq[-back:].copy()
        mixed = context[0] * np.uint64(shape.multipliers[0])
        index = np.empty((ids.size, self.n_heads), dtype=np.int64)
        for order in range(2, shape.ngram + 1):
            mixed ^= context[order - 1] * np.uint64(shape.multipliers[order - 1])
            for head in range((order - 2) * shape.heads_per_ngram, (order - 1) * shape.heads_per_ngram):
                index[:, head] = (mixed % np.uint64(shape.head_sizes[head])).astype(np.int64) + shape.head_offsets[head]
        return index

    def row_indices(self, token: int) -> list[int]:
        """The table rows of `token` after the ids seen so far (which it joins): the reference's n-gram hash
        (strata.reference.ple.ngram_rows) for one token, on Python ints, since this runs before every token."""
        shape, mask = self.shape, (1 << 64) - 1
        context, cut = [int(token)], False
        for s in range(1, shape.ngram):
            previous = int(self.previous[-s])
            cut = cut or previous == shape.eos
            context.append(shape.eos if cut else previous)
        self.previous = np.concatenate([self.previous[1:], [token]])
        mixed = (context[0] * shape.multipliers[0]) & mask
        index = []
        for order in range(2, shape.ngram + 1):
            mixed ^= (context[order - 1] * shape.multipliers[order - 1]) & mask
            for head in range((order - 2) * shape.heads_per_ngram, (order - 1) * shape.heads_per_ngram):
                index.append(mixed % shape.head_sizes[head] + shape.head_offsets[head])
        return index
