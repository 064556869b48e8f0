"""Per-type block kernels: GGUF block bytes -> the planes of docs/forms.md, vectorized numpy.

Every kernel takes ``blocks`` (uint8 ``[n, type_size]``, one GGUF block per row) and ``out``, the plane
views of the same ``n`` blocks (``codes`` ``[n, code bytes]``, ``d`` ``[n, 1]`` ...), and fills ``out``.
Nibble and crumb shuffles run on uint64 words (8 codes bytes per operation), which is what makes numpy
fast enough here; GGUF element order of each type is documented in gguf-py's quants.py.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

Kernel = Callable[[np.ndarray, dict[str, np.ndarray]], None]

_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_CRUMBS = np.uint64(0x0303030303030303)
_LOW_BITS = np.uint64(0x0101010101010101)
_CRUMB_SHIFTS = np.arange(0, 8, 2, dtype=np.uint64)  # 0, 2, 4, 6
_BIT_SHIFTS = np.arange(8, dtype=np.uint64)
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint64)


def byte_view(plane: np.ndarray) -> np.ndarray:
    """A plane view as raw bytes, one row per block."""
    return plane.view(np.uint8)


def _words(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes ``start:stop`` of every block as uint64 words; a view when aligned, else a compact copy."""
    field = blocks[:, start:stop]
    if field.strides[0] % 8 == 0 and field.ctypes.data % 8 == 0:
        return field.view(np.uint64)
    return np.ascontiguousarray(field).view(np.uint64)


def _copy_field(blocks: np.ndarray, start: int, stop: int, dst: np.ndarray) -> None:
    """Bytes ``start:stop`` of every block into ``dst`` (one row per block), one memcpy-like item per block."""
    item = f"V{stop - start}"
    np.copyto(dst.view(np.uint8).view(item), blocks[:, start:stop].view(item))


def compact_field(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes ``start:stop`` of every block as a new compact ``[n, stop - start]`` array: numpy passes over it
    then run one long loop instead of one short loop per block."""
    field = np.empty((blocks.shape[0], stop - start), np.uint8)
    _copy_field(blocks, start, stop, field)
    return field


def copy_fp16(blocks: np.ndarray, offset: int, plane: np.ndarray) -> None:
    np.copyto(plane.view(np.uint16).reshape(-1), blocks[:, offset:offset + 2].view(np.uint16).reshape(-1))


def _copy_negated_fp16(blocks: np.ndarray, offset: int, plane: np.ndarray) -> None:
    """K-quants store ``dmin`` and subtract it; the form stores ``-dmin`` and adds (exact: a sign flip)."""
    copy_fp16(blocks, offset, plane)
    np.bitwise_xor(plane.view(np.uint16), np.uint16(0x8000), out=plane.view(np.uint16))


@functools.lru_cache(maxsize=32)
def _every_fourth_word(mask: int, first: int, second: int, n_words: int) -> np.ndarray:
    """``mask`` at word positions ``first`` and ``second`` of every 4, zero elsewhere (read-only)."""
    pattern = np.zeros(4, np.uint64)
    pattern[[first, second]] = mask
    tiled = np.tile(pattern, n_words // 4)
    tiled.flags.writeable = False
    return tiled


def _swap_bits(words: np.ndarray, distance: int, shift: int, mask: np.ndarray) -> None:
    """Where ``mask[i]`` is set, exchange bits ``mask << shift`` of word i with bits ``mask`` of word i + distance.

    One flat pass over contiguous words (a "delta swap"); masked positions never overlap their partners.
    """
    t = words[:-distance] >> np.uint64(shift)
    t ^= words[distance:]
    t &= mask[:-distance]
    words[distance:] ^= t
    t <<= np.uint64(shift)
    words[:-distance] ^= t


def _nibbles_to_bytes(packed: np.ndarray, codes: np.ndarray) -> None:
    """16 bytes per 32-block, low nibble = code j, high = code j+16 -> one byte per code."""
    np.bitwise_and(packed, 0x0F, out=codes[:, :16])
    np.right_shift(packed, 4, out=codes[:, 16:])


def _add_fifth_bits(qh: np.ndarray, codes: np.ndarray) -> None:
    """Q5_0/Q5_1: bit j of the little-endian 32-bit ``qh`` is bit 4 of code j."""
    high = np.unpackbits(qh, axis=1, bitorder="little")
    high <<= 4
    codes |= high


def _q8_0(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    copy_fp16(blocks, 0, out["d"])
    _copy_field(blocks, 2, 34, out["codes"])
    words = out["codes"].view(np.uint64)
    np.bitwise_xor(words, np.uint64(0x8080808080808080), out=words)  # int8 q -> q + 128


def _q4_0(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:  # also IQ4_NL: same block, same packing
    copy_fp16(blocks, 0, out["d"])
    _copy_field(blocks, 2, 18, out["codes"])


def _q4_1(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    copy_fp16(blocks, 0, out["d"])
    copy_fp16(blocks, 2, out["mins"])
    _copy_field(blocks, 4, 20, out["codes"])


def _q5_0(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    copy_fp16(blocks, 0, out["d"])
    _nibbles_to_bytes(blocks[:, 6:22], out["codes"])
    _add_fifth_bits(blocks[:, 2:6], out["codes"])


def _q5_1(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    copy_fp16(blocks, 0, out["d"])
    copy_fp16(blocks, 2, out["mins"])
    _nibbles_to_bytes(blocks[:, 8:24], out["codes"])
    _add_fifth_bits(blocks[:, 4:8], out["codes"])


# e8m0 exponent byte -> 2^(e-128) as float32 (ggml's "half" scale, e2m1 values being doubled)
_E8M0_HALF = np.where(np.arange(256) < 2, np.uint32(0x00200000) << np.arange(256, dtype=np.uint32),
                      (np.arange(256, dtype=np.uint32) - 1) << np.uint32(23)).astype(np.uint32).view(np.float32)


def _mxfp4(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    np.take(_E8M0_HALF, blocks[:, 0], out=out["d"][:, 0])
    _copy_field(blocks, 1, 17, out["codes"])


def _q2_k(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # scales[16] | qs[64] | d | dmin. Per 128 elements, element 32*k + l sits in bits 2k of qs[l].
    for plane in (out["sub_scales"], out["sub_mins"]):
        _copy_field(blocks, 0, 16, plane)
    scales, mins = out["sub_scales"].view(np.uint64), out["sub_mins"].view(np.uint64)
    np.bitwise_and(scales, _LOW_NIBBLES, out=scales)
    np.right_shift(mins, np.uint64(4), out=mins)
    np.bitwise_and(mins, _LOW_NIBBLES, out=mins)
    copy_fp16(blocks, 80, out["d"])
    _copy_negated_fp16(blocks, 82, out["mins"])
    _copy_crumb_columns(blocks, 16, out["codes"])


def _copy_crumb_columns(blocks: np.ndarray, start: int, codes: np.ndarray) -> None:
    """Q2_K / TQ2_0 qs (64 bytes from ``start``): per 128 elements, element 32k + l sits in bits 2k of qs[l]."""
    # Each 32 bytes of qs are four words W0..W3 with crumb k of W_i = code 8i + j of block k; block k's
    # 8 bytes want crumb i = that code. A 4x4 crumb transpose: two rounds of delta swaps.
    _copy_field(blocks, start, start + 64, codes)
    words = codes.view(np.uint64).reshape(-1)
    _swap_bits(words, 2, 4, _every_fourth_word(0x0F0F0F0F0F0F0F0F, 0, 1, words.size))
    _swap_bits(words, 1, 2, _every_fourth_word(0x3333333333333333, 0, 2, words.size))


# Ternary types: code = q + 1 (value q - 1); their form has sub-scales of 1 (forms.py says why).


def _tq2_0(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # qs[64] laid out as Q2_K's | d. A crumb of 3 (never written by llama.cpp) reads as value 2 on both sides.
    _copy_crumb_columns(blocks, 0, out["codes"])
    copy_fp16(blocks, 64, out["d"])
    out["sub_scales"].fill(1)


def _tq1_0(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # qs[48] | qh[4] | d. A byte holds 5 base-3 digits (qh: 4) as a fixed-point fraction of 256: digit p is
    # ((byte * 3^p mod 256) * 3) >> 8, i.e. (x >= 86) + (x >= 171) for x = byte * 3^p mod 256. Digit p of qs[l]
    # is element 32p + l (l < 32) or 160 + 16p + (l - 32); digit p of qh[l] is element 240 + 4p + l.
    n = blocks.shape[0]
    packed = compact_field(blocks, 0, 52)
    codes = np.empty((n, 256), np.uint8)
    for p in range(5):
        shifted = packed * np.uint8(3**p)  # wraps mod 256, as the format wants
        digits = np.add(shifted >= 86, shifted >= 171, dtype=np.uint8)
        _copy_field(digits, 0, 32, codes[:, 32 * p:32 * p + 32])
        _copy_field(digits, 32, 48, codes[:, 160 + 16 * p:176 + 16 * p])
        if p < 4:
            _copy_field(digits, 48, 52, codes[:, 240 + 4 * p:244 + 4 * p])
    words = codes.view(np.uint64).reshape(-1, 4)  # per 32-element block, word i: its codes 8i .. 8i + 7
    crumbs = out["codes"].view(np.uint64).reshape(-1)
    np.left_shift(words[:, 3], np.uint64(6), out=crumbs)
    for i in range(3):
        crumbs |= words[:, i] << np.uint64(2 * i)
    copy_fp16(blocks, 52, out["d"])
    out["sub_scales"].fill(1)


def _q3_k(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # hmask[32] | qs[64] | scales[12] | d. Element 128h + 32s + l: low 2 bits in bits 2s of qs[32h + l],
    # high bit in bit (4h + s) of hmask[l]; value = low - 4 * (1 - high) = code - 4 with code = low + 4 * high.
    n = blocks.shape[0]
    copy_fp16(blocks, 108, out["d"])
    low = blocks[:, 96:104].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    high = blocks[:, 104:108].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    scale = (low.reshape(n, 16) & 0x0F) | ((high.reshape(n, 16) & 0x03) << 4)
    np.subtract(scale, 32, out=byte_view(out["sub_scales"]))  # wraps to the int8 value scale - 32
    qs = _words(blocks, 32, 96).reshape(n, 2, 1, 4)
    hmask = _words(blocks, 0, 32).reshape(n, 1, 4)
    codes = out["codes"].view(np.uint64).reshape(n, 8, 4)
    np.bitwise_and(qs >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1), _LOW_CRUMBS, out=codes.reshape(n, 2, 4, 4))
    high_bits = (hmask >> _BIT_SHIFTS.reshape(1, 8, 1)) & _LOW_BITS
    high_bits <<= np.uint64(2)
    codes |= high_bits


def _k_scales_and_mins(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Q4_K/Q5_K: d | dmin | 12 bytes holding 8 six-bit scales and 8 six-bit mins."""
    copy_fp16(blocks, 0, out["d"])
    _copy_negated_fp16(blocks, 2, out["mins"])
    words = blocks[:, 4:16].view(np.uint32)  # one column per 4 bytes: whole-tensor ops, not per-block ones
    a, b, c = words[:, 0], words[:, 1], words[:, 2]
    scales, mins = out["sub_scales"].view(np.uint32), out["sub_mins"].view(np.uint32)
    np.bitwise_and(a, 0x3F3F3F3F, out=scales[:, 0])
    np.bitwise_or(c & 0x0F0F0F0F, (a >> 2) & 0x30303030, out=scales[:, 1])
    np.bitwise_and(b, 0x3F3F3F3F, out=mins[:, 0])
    np.bitwise_or((c >> 4) & 0x0F0F0F0F, (b >> 2) & 0x30303030, out=mins[:, 1])


def _q4_k(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # Per 64 elements, 32 bytes: low nibbles hold elements 0..31, high nibbles 32..63. With x = bytes
    # 0..15 and y = bytes 16..31, the form wants lo(x) | lo(y) << 4, then hi(x) | hi(y) << 4: swapping
    # the high nibbles of x with the low nibbles of y does it in place.
    _k_scales_and_mins(blocks, out)
    codes = out["codes"]
    _copy_field(blocks, 16, 144, codes)
    words = codes.view(np.uint64).reshape(-1)
    _swap_bits(words, 2, 4, _every_fourth_word(0x0F0F0F0F0F0F0F0F, 0, 1, words.size))


def _q5_k(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # ... | qh[32] | qs[128]. Element 64c + 32t + l: nibble t of qs[32c + l], bit 4 in bit (2c + t) of qh[l].
    _k_scales_and_mins(blocks, out)
    n = blocks.shape[0]
    qs = _words(blocks, 48, 176).reshape(n, 4, 1, 4)
    qh = _words(blocks, 16, 48).reshape(n, 1, 4)
    codes = out["codes"].view(np.uint64).reshape(n, 8, 4)
    np.bitwise_and(qs >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1), _LOW_NIBBLES, out=codes.reshape(n, 4, 2, 4))
    high_bits = (qh >> _BIT_SHIFTS.reshape(1, 8, 1)) & _LOW_BITS
    high_bits <<= np.uint64(4)
    codes |= high_bits


def _q6_k(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # ql[128] | qh[64] | scales[16] int8 | d. Element 128h + 64t + j: nibble t of ql[64h + j];
    # element 128h + 32s + l: bits 4..5 in bits 2s of qh[32h + l]. Code = value + 32.
    n = blocks.shape[0]
    np.copyto(byte_view(out["sub_scales"]), blocks[:, 192:208])
    copy_fp16(blocks, 208, out["d"])
    ql = _words(blocks, 0, 128).reshape(n, 2, 1, 8)
    qh = _words(blocks, 128, 192).reshape(n, 2, 1, 4)
    codes = out["codes"].view(np.uint64).reshape(n, 8, 4)
    np.bitwise_and(ql >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1), _LOW_NIBBLES, out=codes.reshape(n, 2, 2, 8))
    high = (qh >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & _LOW_CRUMBS
    high <<= np.uint64(4)
    codes |= high.reshape(n, 8, 4)


def _iq4_xs(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | scales_h (u16, 2 bits per group) | scales_l[4] (a nibble per group) | qs[128], packed as the form.
    n = blocks.shape[0]
    copy_fp16(blocks, 0, out["d"])
    low = (blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8)) & 0x0F
    scales_h = blocks[:, 2].astype(np.uint16) | (blocks[:, 3].astype(np.uint16) << 8)
    high = (scales_h.reshape(n, 1) >> np.arange(0, 16, 2, dtype=np.uint16)) & 0x03
    scale = low.reshape(n, 8) | (high.astype(np.uint8) << 4)
    np.subtract(scale, 32, out=byte_view(out["sub_scales"]))  # wraps to the int8 value scale - 32
    _copy_field(blocks, 8, 136, out["codes"])


KERNELS: dict[T, Kernel] = {
    T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
    T.IQ4_NL: _q4_0, T.IQ4_XS: _iq4_xs, T.MXFP4: _mxfp4, T.TQ1_0: _tq1_0, T.TQ2_0: _tq2_0,
}
