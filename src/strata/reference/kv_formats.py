"""The KV cache formats of strata.KV in numpy (docs/architecture.md, 'KV formats'): what a head row of keys or
values becomes once a session stores it, computed as the GPU kernels compute it (cuda/src/kernels/kv.cuh,
kv_rotation.cuh), so that the reference can decode with the cache a session holds.

Each half of a layer's cache (its keys, its values) holds its rows in one of three codes:
  bf16  every element rounded to bfloat16 (to nearest, ties to even).
  int8  per 32 consecutive elements of a row one scale d = amax / 127 and codes round(x / d) in -127..127.
  q4    the row rotated first (`rotate`), then per 32 rotated elements d = amax / 7.5 and codes round(x / d)
        clamped to -8..7. The grid -8d..7d holds every x of [-7.5d, 7.5d] = [-amax, amax] within d / 2 (the
        ends round to -8 and clamp to 7): the finest step with that bound (amax / 7 would leave -8 unused).
        The cache holds the rotated row; attention rotates q and its output to match.
The formats: BF16, INT8 and Q4 use those codes for both halves; K8V4 keeps keys as int8 (no rotation: int8
needs none) and values as q4.

Scales are amax / top in float32 rounded to fp16; codes are x / d in float32 rounded ties-to-even; an element
reads back as d * code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.errors import InvalidArgument
from strata.options import KV

GROUP = 32          # elements per fp16 scale
ROTATION_MAX = 256  # the widest Walsh-Hadamard block


@dataclass(frozen=True)
class Codes:
    """How one half of the cache holds an element: its name and, for scaled codes, amax / top = d and the
    code range lo..hi."""

    name: str
    top: float = 0.0
    lo: int = 0
    hi: int = 0
    rotated: bool = False

    @property
    def scaled(self) -> bool:
        return self.top > 0


BF16 = Codes("bf16")
INT8 = Codes("int8", 127.0, -127, 127)
Q4 = Codes("q4", 7.5, -8, 7, rotated=True)

_HALVES = {KV.BF16: (BF16, BF16), KV.INT8: (INT8, INT8), KV.K8V4: (INT8, Q4), KV.Q4: (Q4, Q4)}


def halves(kv: KV | str) -> tuple[Codes, Codes]:
    """The codes of the keys and of the values of format `kv`."""
    return _HALVES[KV.parse(kv)]


def rotation_width(head_dim: int) -> int:
    """min(256, the largest power of two dividing head_dim): the rows are rotated in blocks of this width (one
    256-block per 256 elements, the whole row for a power of two below 256, else the widest power-of-two blocks
    that tile it: 96 -> three of 32)."""
    if head_dim <= 0 or head_dim % GROUP:
        raise InvalidArgument(f"KV head_dim {head_dim} is not a positive multiple of {GROUP} (KV groups)")
    return min(ROTATION_MAX, head_dim & -head_dim)


def rotate(x: np.ndarray) -> np.ndarray:
    """Each row (last axis) times the orthonormal Walsh-Hadamard matrix H_n / sqrt(n), block by block
    (n = rotation_width), H_n the Sylvester Hadamard matrix in natural order; its own inverse. float64 rows are
    rotated in float64; anything else in float32 with the GPU's operations in the GPU's order (butterfly sums
    and differences stage by stage, then times 1 / sqrt(n)), so the kernel's result is reproduced bit for bit."""
    x = np.asarray(x)
    dtype = np.float64 if x.dtype == np.float64 else np.float32
    d = x.shape[-1]
    n = rotation_width(d)
    y = x.astype(dtype).reshape(-1, n)
    h = 1
    while h < n:
        pairs = y.reshape(-1, n // (2 * h), 2, h)  # index (b, s, r) = b * 2h + s * h + r pairs s = 0 with s = 1
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = np.stack([a + b, a - b], axis=2).reshape(-1, n)
        h *= 2
    return (y * (dtype(1) / np.sqrt(dtype(n)))).reshape(x.shape)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 (ties to even), back as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def quantize(x: np.ndarray, codes: Codes) -> tuple[np.ndarray, np.ndarray]:
    """Rows x [..., head_dim] (in the half's basis: rotate them first for q4) -> (codes int8 [..., head_dim],
    scales fp16 [..., head_dim / 32]) of scaled `codes`."""
    g = np.asarray(x, dtype=np.float32).reshape(*np.shape(x)[:-1], -1, GROUP)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # amax past top * 65504 gives an infinite scale (and NaN), as on the GPU
        d = (amax / np.float32(codes.top)).astype(np.float16)
    step = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.clip(np.rint(g / step), codes.lo, codes.hi), 0.0)
    return q.astype(np.int8).reshape(np.shape(x)), d[..., 0]


def dequantize(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """d * code for codes [..., head_dim] and their scales [..., head_dim / 32], float32."""
    groups = q.reshape(*q.shape[:-1], -1, GROUP).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return (groups * d.astype(np.float32)[..., None]).reshape(q.shape)


def cached(x: np.ndarray, codes: Codes) -> np.ndarray:
    """Rows x [..., head_dim] as a half of `codes` holds them, read back as float32: in the rotated basis for
    q4 (what the attention kernels read)."""
    x = np.asarray(x, dtype=np.float32)
    if not codes.scaled:
        return bf16_round(x)
    return dequantize(*quantize(rotate(x) if codes.rotated else x, codes))


def held(x: np.ndarray, codes: Codes) -> np.ndarray:
    """Rows x [..., head_dim] as a half of `codes` holds them, in the model's basis (a q4 row rotated back in
    float64): what attention over the cache computes with, float32."""
    stored = cached(x, codes)
    return rotate(stored.astype(np.float64)).astype(np.float32) if codes.rotated else stored
