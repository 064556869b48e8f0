"""q8_32 activation quantization and the matvec of docs/forms.md's activation contract (numpy)."""

from __future__ import annotations

import numpy as np

from strata.errors import InvalidArgument
from strata.quant.dequant import dequantize, group_offsets, group_scales, unpack_codes
from strata.quant.forms import BLOCK
from strata.quant.tensor import QuantTensor


def round_half_away_from_zero(r: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero; exact for |r| < 2^23 (r - trunc(r) is exact)."""
    whole = np.trunc(r)
    return whole + np.sign(r) * (np.abs(r - whole) >= 0.5)


def quantize_activation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q8_32 of ``x [..., cols]`` (as float32): (xq int8 [..., cols], dx float32 [..., cols/32], sums int32 [..., cols/32]).

    Per block of 32: ``dx = max|x| / 127``, ``xq = round_half_away_from_zero(x / dx)``, ``sums = Σ xq``.
    A block whose ``dx`` is 0 (all zero, or so tiny that ``max|x| / 127`` underflows) quantizes to zeros.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % BLOCK:
        raise InvalidArgument(f"quantize_activation: last axis must be a multiple of {BLOCK}; found shape {x.shape}")
    if not np.isfinite(x).all():
        raise InvalidArgument(f"quantize_activation: x has {np.count_nonzero(~np.isfinite(x))} NaN/Inf values")
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    dx = np.abs(blocks).max(axis=-1) / np.float32(127)
    zero = dx == 0
    ratio = blocks / np.where(zero, np.float32(1), dx)[..., None]
    # |ratio| <= 127 up to rounding; the clip only matters for subnormal dx, where x / dx loses precision.
    xq = np.clip(round_half_away_from_zero(ratio), -127, 127).astype(np.int8)
    xq[zero] = 0
    sums = xq.sum(axis=-1, dtype=np.int32)
    return xq.reshape(x.shape), dx, sums


def matvec(q: QuantTensor | np.ndarray, x: np.ndarray) -> np.ndarray:
    """``y = W x`` as float32 ``[rows]`` (or ``[n, rows]`` for ``x [n, cols]``) under the form's activation contract.

    Float forms multiply float32 ``x``. Quantized forms take ``x`` as q8_32; every inner sum over a group
    (``Σ v_i xq_i`` and ``Σ xq_i``) is exact in int32, then scaled in float32 per docs/forms.md.
    """
    x = np.asarray(x, dtype=np.float32)
    batched = x.ndim == 2
    if x.ndim not in (1, 2):
        raise InvalidArgument(f"matvec: x must be [cols] or [n, cols]; found shape {x.shape}")
    cols = q.cols if isinstance(q, QuantTensor) else q.shape[1]
    if x.shape[-1] != cols:
        raise InvalidArgument(f"matvec: x has {x.shape[-1]} columns, the weight has {cols}")
    x2 = x.reshape(-1, cols)
    if isinstance(q, np.ndarray):
        w = dequantize(q)
        y = np.stack([w @ v for v in x2])  # one gemv per vector: a vector's result never depends on the batch
    else:
        y = _quantized_matvec(q, x2)
    return y if batched else y[0]


def _quantized_matvec(q: QuantTensor, x: np.ndarray) -> np.ndarray:
    xq, dx, _ = quantize_activation(x)
    group = q.form.group_size
    n, rows, n_groups = x.shape[0], q.rows, q.cols // group
    values = q.form.values().astype(np.int32)[unpack_codes(q.form, q.codes)].reshape(rows, n_groups, group)
    xq_groups = xq.astype(np.int32).reshape(n, n_groups, group)
    # |v| <= 255 and |xq| <= 127 over at most 32 elements: far inside int32.
    dots = np.einsum("rgi,ngi->nrg", values, xq_groups)
    terms = group_scales(q)[None] * dots.astype(np.float32)  # [n, rows, groups]
    offsets = group_offsets(q)
    if offsets is not None:
        terms += offsets[None] * xq_groups.sum(axis=-1, dtype=np.int32)[:, None, :].astype(np.float32)
    per_block = terms.reshape(n, rows, -1, BLOCK // group).sum(axis=-1)
    return (per_block * dx[:, None, :]).sum(axis=-1, dtype=np.float32)
