"""Output types of the converter and float32 -> GGUF bytes for each."""

from __future__ import annotations

import gguf
import numpy as np

from strata.errors import InvalidArgument

T = gguf.GGMLQuantizationType
OUT_TYPES = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}


def out_type(name: str) -> T:
    try:
        return OUT_TYPES[name.lower()]
    except KeyError:
        raise InvalidArgument(f"outtype {name!r} is not supported; expected one of {sorted(OUT_TYPES)}") from None


def tensor_type(ne: tuple[int, ...], forced_f32: bool, outtype: T) -> T:
    """llama.cpp's rule: forced tensors F32; Q8_0 only where ne0 fills 32-blocks, else F16."""
    if forced_f32:
        return T.F32
    if outtype == T.Q8_0 and ne[0] % gguf.GGML_QUANT_SIZES[T.Q8_0][0]:
        return T.F16
    return outtype


def encode(rows: np.ndarray, ggml_type: T) -> np.ndarray:
    """float32 rows [n, ne0] -> the bytes of that type, as a numpy array (uint8 or the float dtype)."""
    if ggml_type == T.F32:
        return np.ascontiguousarray(rows, dtype=np.float32)
    if ggml_type == T.F16:
        return rows.astype(np.float16)
    # BF16 (round to nearest even) and Q8_0 exactly as llama.cpp's converter rounds them
    return gguf.quants.quantize(np.ascontiguousarray(rows, dtype=np.float32), ggml_type)
