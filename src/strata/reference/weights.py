"""Where the reference gets its weights, and the single place every weight product happens.

Two sources: a Mapping of GGUF-named float32 arrays (numpy shape = reversed ggml ne, so a weight is
[out, in]) for unit tests, or a strata.format.ModelFile whose tensors are dequantized on demand.
With `activation_quant`, every product goes through strata.quant.matvec (the q8_32 activation contract of
docs/forms.md) on the tensor's canonical form instead of float64 math on dequantized values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from strata.errors import FormatError, InvalidArgument


class Weights:
    """GGUF-named weights with `matmul`, `rows` and `get`; the base holds plain float arrays."""

    def __init__(self, tensors: Mapping[str, np.ndarray], *, activation_quant: bool = False):
        self._tensors = tensors
        self.activation_quant = activation_quant
        self._cache: dict[tuple[str, int | None], Any] = {}

    def has(self, name: str) -> bool:
        return name in self._tensors

    def _require(self, name: str) -> None:
        if not self.has(name):
            raise FormatError(f"tensor {name!r} is required by the forward pass but is missing")

    def ne(self, name: str) -> tuple[int, ...]:
        """The tensor's ggml shape (ne0 fastest)."""
        self._require(name)
        return tuple(reversed(np.shape(self._tensors[name])))

    def get(self, name: str) -> np.ndarray:
        """The whole tensor as float32, numpy shape = reversed ggml ne."""
        self._require(name)
        return np.asarray(self._tensors[name], dtype=np.float32)

    def rows(self, name: str, index: np.ndarray) -> np.ndarray:
        """Rows `index` of a 2-D table (embeddings), float32 [len(index), row width]."""
        table = self.get(name)
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= table.shape[0]):
            raise InvalidArgument(
                f"row index out of range for {name!r}: rows [0, {table.shape[0]}), got "
                f"[{index.min()}, {index.max()}]")
        return table[index]

    def _matrix(self, name: str, expert: int | None) -> np.ndarray:
        """The [out, in] float matrix (expert `expert` of a 3-D tensor)."""
        w = self.get(name)
        if w.ndim == 1:  # a gate vector stored as ne {in} (e.g. ffn_gate_inp_shexp) is a 1-row matrix
            return w.reshape(1, -1)
        return w if expert is None else w[expert]

    def _canonical(self, name: str, expert: int | None) -> Any:
        """What strata.quant.matvec takes; float sources are already canonical."""
        return self._matrix(name, expert)

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        """y = W x for each row of x ([T, in] -> [T, out]), float32 result.

        Float path: float64 products of the float32 weights. Quantized-activation path: strata.quant.matvec.
        """
        x = np.asarray(x)
        if x.ndim != 2:
            raise InvalidArgument(f"matmul with {name!r} wants x of shape [T, in], got {x.shape}")
        if self.activation_quant:
            key = (name, expert)
            if key not in self._cache:
                self._cache[key] = self._canonical(name, expert)
            from strata import quant  # imported here: only this mode needs it
            return np.asarray(quant.matvec(self._cache[key], x.astype(np.float32)), dtype=np.float32)
        w = self._matrix(name, expert)
        if w.ndim != 2 or w.shape[1] != x.shape[1]:
            raise FormatError(f"tensor {name!r} has shape {w.shape}, expected [out, {x.shape[1]}]")
        return (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)


class FileWeights(Weights):
    """Weights read from a strata.format.ModelFile, dequantized lazily (only the rows/experts used)."""

    def __init__(self, model_file: Any, *, activation_quant: bool = False):
        super().__init__(model_file.tensors, activation_quant=activation_quant)
        self._file = model_file
        self._dense: dict[str, np.ndarray] = {}

    def _info(self, name: str) -> Any:
        self._require(name)
        return self._file.tensors[name]

    def ne(self, name: str) -> tuple[int, ...]:
        return tuple(self._info(name).ne)

    def get(self, name: str) -> np.ndarray:
        if name not in self._dense:
            from strata import quant
            info = self._info(name)
            self._dense[name] = quant.dequantize_raw(self._file.raw(name), info.ggml_type, info.ne)
        return self._dense[name]

    def _slice(self, name: str, first: int, count: int) -> tuple[np.ndarray, Any, tuple[int, ...]]:
        """Raw bytes and ne of `count` consecutive rows (outermost index) starting at `first`."""
        info = self._info(name)
        outer = info.ne[-1]
        per = info.nbytes // outer
        raw = self._file.raw(name)[first * per:(first + count) * per]
        return raw, info.ggml_type, tuple(info.ne[:-1]) + (count,)

    def rows(self, name: str, index: np.ndarray) -> np.ndarray:
        from strata import quant
        info = self._info(name)
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= info.ne[-1]):
            raise InvalidArgument(
                f"row index out of range for {name!r}: rows [0, {info.ne[-1]}), got [{index.min()}, {index.max()}]")
        out = [quant.dequantize_raw(*self._slice(name, int(i), 1)).reshape(-1) for i in index]
        return np.stack(out) if out else np.zeros((0, info.ne[0]), dtype=np.float32)

    def _matrix(self, name: str, expert: int | None) -> np.ndarray:
        if expert is None:
            w = self.get(name)
            return w.reshape(1, -1) if w.ndim == 1 else w
        key = f"{name}#{expert}"
        if key not in self._dense:
            from strata import quant
            self._dense[key] = quant.dequantize_raw(*self._slice(name, expert, 1)).reshape(
                self._info(name).ne[1], self._info(name).ne[0])
        return self._dense[key]

    def _canonical(self, name: str, expert: int | None) -> Any:
        from strata import quant
        info = self._info(name)
        if expert is None:
            ne = tuple(info.ne) if len(info.ne) >= 2 else (info.ne[0], 1)
            return quant.repack(self._file.raw(name), info.ggml_type, ne)
        raw, ggml_type, ne = self._slice(name, expert, 1)
        return quant.repack(raw, ggml_type, ne[:2])
