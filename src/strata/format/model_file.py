"""inspect(): open and validate a whole GGUF model file without reading tensor data."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import FormatError
from strata.format.inventory_check import check_tensors, with_file_ple_rows
from strata.format.scanner import V, TensorInfo, scan
from strata.format.tokenizer import Tokenizer
from strata.format.tokenizer_check import check_tokenizer_keys, check_tokenizer_metadata
from strata.models import Geometry, geometry_from_metadata


class ModelFile:
    """A validated GGUF model file; tensor bytes are memory-mapped views, never copies."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._tokenizer: Tokenizer | None = None
        size = _file_size(self.path)
        try:
            self._map: np.memmap | None = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise FormatError(f"{self.path}: cannot map the file ({exc})") from None
        try:
            scanned = scan(self._map, size)
            self.metadata: dict[str, Any] = scanned.metadata
            self.value_types: dict[str, V] = scanned.value_types   # a scalar's type, an array's element type
            self.tensors: dict[str, TensorInfo] = scanned.tensors
            self.data_start: int = scanned.data_start      # absolute file offset of the data section
            check_tokenizer_keys(self.metadata, self.value_types)
            geometry = geometry_from_metadata(self.metadata)
            self.geometry: Geometry = with_file_ple_rows(geometry, self.tensors)
            self.arch: str = self.geometry.arch
            self.warnings: list[str] = check_tensors(self.geometry, self.tensors, self.geometry.n_mtp)
            self.warnings += check_tokenizer_metadata(self.metadata, self.geometry.n_vocab)
            self.warnings += _qsa_warnings(self.geometry)
        except BaseException:
            self.close()
            raise

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a uint8 view of the memory-mapped file (no copy)."""
        if self._map is None:
            raise FormatError(f"{self.path}: the file is closed")
        info = self.tensors.get(name)
        if info is None:
            raise FormatError(f"{self.path}: no tensor named {name!r}")
        start = self.data_start + info.offset
        return self._map[start:start + info.nbytes]

    def release(self, name: str) -> None:
        """Drops the pages of tensor `name` that this process has mapped (MADV_DONTNEED): once a load has repacked
        a tensor, its file bytes no longer count against the process's memory. A view of them still reads the
        file's bytes, from the page cache or the disk."""
        if self._map is None:
            raise FormatError(f"{self.path}: the file is closed")
        info = self.tensors[name]
        start = (self.data_start + info.offset) // mmap.PAGESIZE * mmap.PAGESIZE
        end = self.data_start + info.offset + info.nbytes
        self._map._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def tokenizer(self) -> Tokenizer:
        """The file's tokenizer, built on first use (a large vocabulary takes a moment) and kept."""
        if "tokenizer.ggml.model" not in self.metadata:
            raise FormatError(f"{self.path}: the file carries no tokenizer (no tokenizer.ggml.model key)")
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.metadata)
        return self._tokenizer

    def close(self) -> None:
        # Views already handed out keep the mapping alive until they are dropped; numpy unmaps then.
        self._map = None

    def __enter__(self) -> ModelFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, arch={self.arch!r}, {len(self.tensors)} tensors)"


def _file_size(path: Path) -> int:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise FormatError(f"{path}: cannot read the file ({exc.strerror})") from None
    if size < 24:      # magic, version, two counts
        raise FormatError(f"{path}: file truncated: {size} bytes is shorter than a GGUF header (24 bytes)")
    return size


def _qsa_warnings(g: Geometry) -> list[str]:
    # A checkpoint re-saved by transformers >= 5 converts to ratio 0 on attention layers although the indexer
    # tensors are present; transformers always runs QSA there, and so does strata (qwen4exp.md §5.3).
    zero = [layer for layer in g.attention_layers if g.compress_ratios and g.compress_ratios[layer] == 0]
    if not zero:
        return []
    return [f"attention.compress_ratios is 0 on attention layer(s) {zero[:8]}{'...' if len(zero) > 8 else ''} "
            f"although their indexer tensors are present; strata runs QSA there (ratio {g.qsa_block}, "
            f"budget {g.indexer_top_k} tokens from attention.indexer.top_k)"]


def inspect(path: str | os.PathLike[str]) -> ModelFile:
    """Validate the whole file (structure, architecture, tensors, tokenizer) without reading tensor data."""
    return ModelFile(path)
