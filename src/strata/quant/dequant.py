"""numpy dequantization of the canonical forms, bit-exact with gguf.quants (docs/forms.md)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType as T

from strata.errors import FormatError
from strata.quant.forms import Form, float_form_of
from strata.quant.repacking import repack
from strata.quant.tensor import QuantTensor


def unpack_codes(form: Form, codes: np.ndarray) -> np.ndarray:
    """The packed ``codes`` plane ``[rows, bytes]`` -> one uint8 code per weight ``[rows, cols]``."""
    rows = codes.shape[0]
    per_block = codes.reshape(rows, -1, form.code_bytes_per_block)
    if form.code_bits == 8:
        return codes
    if form.code_bits == 4:  # byte j: code j (low nibble), code j + 16 (high nibble)
        return np.concatenate([per_block & 0x0F, per_block >> 4], axis=-1).reshape(rows, -1)
    if form.code_bits == 2:  # byte j: code j + 8i in bits 2i
        shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1)
        return ((per_block[:, :, None, :] >> shifts) & 0x03).reshape(rows, -1)
    raise FormatError(f"form {form.name}: code_bits={form.code_bits}, expected 2, 4 or 8")


def group_scales(q: QuantTensor) -> np.ndarray:
    """float32 ``d[S] * sub_scales[g]`` per group ``[rows, cols / group_size]`` (just ``d`` without sub-scales)."""
    d = q.d.astype(np.float32)
    if q.sub_scales is None:
        return d
    groups_per_super = q.form.super_size // q.form.group_size
    return (d[:, :, None] * q.sub_scales.astype(np.float32).reshape(q.rows, -1, groups_per_super)).reshape(q.rows, -1)


def group_offsets(q: QuantTensor) -> np.ndarray | None:
    """float32 ``mins[S] * sub_mins[g]`` per group, or None for a symmetric form."""
    if q.mins is None:
        return None
    mins = q.mins.astype(np.float32)
    if q.sub_mins is None:
        return mins
    groups_per_super = q.form.super_size // q.form.group_size
    return (mins[:, :, None] * q.sub_mins.astype(np.float32).reshape(q.rows, -1, groups_per_super)).reshape(q.rows, -1)


def dequantize(q: QuantTensor | np.ndarray) -> np.ndarray:
    """float32 ``[rows, cols]``: ``w = (d * s) * v + mins * sm`` in that float32 order (bit-exact)."""
    if isinstance(q, np.ndarray):
        return _float_to_f32(q)
    values = q.form.values().astype(np.float32)[unpack_codes(q.form, q.codes)]
    values = values.reshape(q.rows, -1, q.form.group_size)
    w = group_scales(q)[:, :, None] * values
    offsets = group_offsets(q)
    if offsets is not None:  # never add a zero: -0.0 + 0.0 would flip the sign bit gguf keeps
        w += offsets[:, :, None]
    return w.reshape(q.rows, q.cols)


def dequantize_raw(raw: np.ndarray, ggml_type: T | int, ne: Sequence[int]) -> np.ndarray:
    """float32 of a GGUF tensor's raw bytes, shaped ``tuple(reversed(ne))``."""
    return dequantize(repack(raw, ggml_type, ne)).reshape(tuple(reversed([int(n) for n in ne])))


def _float_to_f32(array: np.ndarray) -> np.ndarray:
    kind = float_form_of(array).float_kind
    if kind == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)

