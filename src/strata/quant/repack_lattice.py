"""Block kernels of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): GGUF blocks ->
4-bit codebook planes (docs/forms.md), vectorized numpy, the contract of repack_kernels.py.

These types index a grid of 8- (or 4-) weight entries per run of weights and add a sign (IQ1: a +-1/8 delta)
per weight (or run). Every weight is one of at most 16 signed integers times a group scale, so each maps
exactly onto a codebook of forms.py: code = magnitude index | sign << 3 (IQ1: (g + 1) | (delta < 0) << 2 for
the grid value g in -1, 0, 1). The grids come from gguf.quants itself; each entry becomes one uint64 (uint32
for 4 weights) of code bytes, so a run of weights is a table lookup ORed with its sign (delta) bits.

Why the scales are exact. gguf computes, in float32, w = ((d * (ls + 1/2)) * 2^-j) * g * sign (IQ2: j = 2,
IQ3_XXS: j = 1) or w = (d * (2 ls + 1)) * (g + delta) (IQ1, delta = +-1/8). The form computes (d' * s) * v
with d' = d * 2^-k (IQ2, IQ1: k = 3; IQ3_XXS: k = 2), s = 2 ls + 1 and v the integer codebook value. d is a
finite fp16, so every product d * (2 ls + 1) * 2^-i here lies in float32's normal range (or is zero), where
scaling by a power of two commutes with rounding: round(d' * s) is gguf's rounded group scale, bit for bit
(IQ1: exactly 1/8 of it). The last product then rounds the same real number as gguf's: v = sign * g against
the same scale, round-to-nearest being symmetric in sign (IQ1: v = 8 (g + delta) against a scale 8 times
smaller), so every weight agrees in every bit, the signs of zeros included. IQ3_S's group scale
d * (2 ls + 1) needs no fold: its d stays fp16.
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from strata.quant.repack_kernels import Kernel, byte_view, compact_field, copy_fp16

_SIGN_BIT = 0x08  # bit 3 of a code: the negative half of the IQ2 / IQ3 codebooks
_IQ1_NEGATIVE = 0x04  # bit 2 of a code: the delta = -1/8 half of the IQ1 codebook


def _nibble_tables(words: np.ndarray) -> np.ndarray:
    """Row 0: code bytes for the low nibbles; row 1: the same shifted into the high nibbles (read-only)."""
    tables = np.stack([words, words << 4])
    tables.flags.writeable = False
    return tables


def _grid_codes(quant: type) -> np.ndarray:
    """gguf's grid as code bytes (the index of each weight's value in ``grid_map``), one word per entry."""
    quant.init_grid()
    grid = quant.grid.reshape(quant.grid_shape)
    index = np.searchsorted(np.array(quant.grid_map, np.float32), grid).astype(np.uint8)
    word = np.uint64 if quant.grid_shape[1] == 8 else np.uint32
    return _nibble_tables(np.ascontiguousarray(index).view(word).reshape(-1))


# Bits ORed into the codes of a run of 8 weights: a sign byte's bits; IQ2_XXS's 7-bit sign index (its 8th sign
# is the parity); IQ1's delta sign (the same bit in all 8 codes).
_SPREAD_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").view(np.uint64)
_BYTE_SIGNS = _nibble_tables(_SPREAD_BITS.reshape(-1) * np.uint64(_SIGN_BIT))
_INDEXED_SIGNS = _nibble_tables(_BYTE_SIGNS[0][np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)])
_IQ1_DELTAS = _nibble_tables(_SPREAD_BITS[[0, 255]].reshape(-1) * np.uint64(_IQ1_NEGATIVE))
_GRIDS = {t: _grid_codes(quant) for t, quant in (
    (T.IQ2_XXS, gguf.quants.IQ2_XXS), (T.IQ2_XS, gguf.quants.IQ2_XS), (T.IQ2_S, gguf.quants.IQ2_S),
    (T.IQ3_XXS, gguf.quants.IQ3_XXS), (T.IQ3_S, gguf.quants.IQ3_S), (T.IQ1_S, gguf.quants.IQ1_S))}


def _nibble_pair(tables: np.ndarray, low: np.ndarray, high: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """tables[0][low] | tables[1][high]: two runs of codes, the second in the high nibbles."""
    # take() is fast only with intp indices: with narrower ones it is ~15x slower than the conversion.
    return np.bitwise_or(np.take(tables[0], low.astype(np.intp)), np.take(tables[1], high.astype(np.intp)), out=out)


def _mark_words(tables: np.ndarray, runs: list[np.ndarray]) -> list[np.ndarray]:
    """The bits to OR into the two code words of each group, from the table indices of its 4 runs of 8."""
    return [_nibble_pair(tables, runs[0], runs[2]), _nibble_pair(tables, runs[1], runs[3])]


def _pack_codes(codes: np.ndarray, grid: np.ndarray, entries: list[np.ndarray], marks: list[np.ndarray]) -> None:
    """Fills ``codes`` (docs/forms.md's 4-bit packing) group by group of 32 weights.

    ``entries``: per grid entry position in the group (4 of 8 weights or 8 of 4, in element order), the grid
    index of that entry in every group; ``marks``: the sign (delta) bits of the group's two 64-bit code words.
    """
    half = len(entries) // 2  # entries [0, half) are codes 0..15 (low nibbles), the rest codes 16..31
    words = codes.view(grid.dtype).reshape(-1, half)
    for w in range(half):
        _nibble_pair(grid, entries[w], entries[w + half], out=words[:, w])
    words = codes.view(np.uint64).reshape(-1, 2)
    for w in range(2):  # not `|=` on a column: that writes it twice
        np.bitwise_or(words[:, w], marks[w], out=words[:, w])


def _scaled_d(d: np.ndarray, power_of_two: float, out: np.ndarray) -> None:
    """float32 d * 2^-k (fp16 -> float32 is exact, and so is the scaling: see the module doc)."""
    np.multiply(d.reshape(out.shape), np.float32(power_of_two), out=out)


def _fp16_d(blocks: np.ndarray, power_of_two: float, out: np.ndarray) -> None:
    _scaled_d(blocks[:, 0:2].view(np.float16), power_of_two, out)


def _odd_scales(ls: np.ndarray, out: np.ndarray) -> None:
    """sub_scales = 2 * ls + 1 (ls < 16, so at most 31); ``ls`` in the plane's order, any shape."""
    np.copyto(byte_view(out).reshape(ls.shape), ls * 2 + 1, casting="unsafe")


def _nibble_scales(scales: np.ndarray, out: np.ndarray) -> None:
    """A 4-bit ls per group, low nibble first (``scales`` compact bytes) -> sub_scales 2 * ls + 1."""
    dst = byte_view(out).reshape(-1, 2)
    np.bitwise_and(scales.reshape(-1), 0x0F, out=dst[:, 0])
    np.right_shift(scales.reshape(-1), 4, out=dst[:, 1])
    dst <<= 1
    dst |= 1


def _with_sign_indices(out: dict[str, np.ndarray], grid: np.ndarray, entries: list[np.ndarray],
                       aux: np.ndarray) -> None:
    """IQ2_XXS / IQ3_XXS codes and sub-scales: a uint32 ``aux`` per group holds four 7-bit sign indices (bits 0,
    7, 14, 21; one per 8 weights) and ls (bits 28..31)."""
    _odd_scales(aux >> np.uint32(28), out["sub_scales"])
    runs = [(aux >> np.uint32(7 * k)) & np.uint32(0x7F) for k in range(4)]
    _pack_codes(out["codes"], grid, entries, _mark_words(_INDEXED_SIGNS, runs))


def _high_bits(low: np.ndarray, field: np.ndarray, shift: int, mask: int) -> np.ndarray:
    """Grid index ``low | ((field >> shift) & mask) << 8``."""
    index = ((field >> shift) & mask).astype(np.intp)
    index <<= 8
    index |= low
    return index


def _with_sign_bytes(blocks: np.ndarray, out: dict[str, np.ndarray], grid: np.ndarray, *, entries: int, qs: int,
                     qh: int, signs: int, scales: int) -> None:
    """IQ2_S / IQ3_S codes and sub-scales from the offsets of their fields: qs, bits 0..7 of each grid index (a
    byte per entry, ``entries`` per group); qh, a byte per group holding bits 8.. of its entries (8 / entries
    bits each, entry e lowest first); signs, a byte per 8 weights; scales, a nibble ls per group."""
    low = compact_field(blocks, qs, qs + 8 * entries).reshape(-1, entries)
    high = compact_field(blocks, qh, qh + 8).reshape(-1)
    sign_bytes = compact_field(blocks, signs, signs + 32).reshape(-1, 4)
    width = 8 // entries
    _pack_codes(out["codes"], grid, [_high_bits(low[:, e], high, width * e, (1 << width) - 1) for e in range(entries)],
                _mark_words(_BYTE_SIGNS, [sign_bytes[:, e] for e in range(4)]))
    _nibble_scales(compact_field(blocks, scales, scales + out["sub_scales"].shape[1] // 2), out["sub_scales"])


def _iq2_xxs(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | per group: 4 grid indices (bytes) | aux u32.
    _fp16_d(blocks, 0.125, out["d"])
    qs = compact_field(blocks, 2, 66).reshape(-1, 8)
    _with_sign_indices(out, _GRIDS[T.IQ2_XXS], [qs[:, e] for e in range(4)], qs.view(np.uint32)[:, 1])


def _iq3_xxs(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | qs[64]: a grid index per 4 weights | aux u32[8], one per group.
    _fp16_d(blocks, 0.25, out["d"])
    qs = compact_field(blocks, 2, 66).reshape(-1, 8)
    aux = compact_field(blocks, 66, 98).view(np.uint32).reshape(-1)
    _with_sign_indices(out, _GRIDS[T.IQ3_XXS], [qs[:, e] for e in range(8)], aux)


def _iq2_xs(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | qs u16[32]: per 8 weights a 9-bit grid index | 7-bit sign index << 9 | scales[8]: a nibble ls per 16.
    _fp16_d(blocks, 0.125, out["d"])
    qs = compact_field(blocks, 2, 66).view(np.uint16).reshape(-1, 4)
    _pack_codes(out["codes"], _GRIDS[T.IQ2_XS], [qs[:, e] & np.uint16(511) for e in range(4)],
                _mark_words(_INDEXED_SIGNS, [qs[:, e] >> np.uint16(9) for e in range(4)]))
    _nibble_scales(compact_field(blocks, 66, 74), out["sub_scales"])


def _iq2_s(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | qs[32] | signs[32] | qh[8] | scales[8]: a nibble ls per 16 weights.
    _fp16_d(blocks, 0.125, out["d"])
    _with_sign_bytes(blocks, out, _GRIDS[T.IQ2_S], entries=4, qs=2, signs=34, qh=66, scales=74)


def _iq3_s(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | qs[64] | qh[8] | signs[32] | scales[4]: a nibble ls per 32 weights. Group scale d * (2 ls + 1): no fold.
    copy_fp16(blocks, 0, out["d"])
    _with_sign_bytes(blocks, out, _GRIDS[T.IQ3_S], entries=8, qs=2, qh=66, signs=74, scales=106)


def _iq1_s(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # d | qs[32]: grid index bits 0..7, per 8 weights | qh u16[8], one per group: bits 8..10 of its entry k at
    # bits 3k, ls in bits 12..14, delta sign in bit 15.
    _fp16_d(blocks, 0.125, out["d"])
    qs = compact_field(blocks, 2, 34).reshape(-1, 4)
    qh = compact_field(blocks, 34, 50).view(np.uint16).reshape(-1)
    _odd_scales((qh >> np.uint16(12)) & np.uint16(7), out["sub_scales"])
    delta = _nibble_pair(_IQ1_DELTAS, qh >> np.uint16(15), qh >> np.uint16(15))  # one delta for all 32
    _pack_codes(out["codes"], _GRIDS[T.IQ1_S], [_high_bits(qs[:, e], qh, 3 * e, 0x07) for e in range(4)],
                [delta, delta])


def _iq1_m(blocks: np.ndarray, out: dict[str, np.ndarray]) -> None:
    # qs[32]: grid index bits 0..7, per 8 weights | qh[16]: a nibble per 8 weights, low first: index bits 8..10,
    # delta sign in bit 3 | scales u16[4]: a 3-bit ls per 16 weights at bits 3k; the top nibbles of the four
    # words, lowest first, are the bits of the fp16 d.
    scales = compact_field(blocks, 48, 56).view(np.uint16)
    d_bits = scales >> np.uint16(12)
    d_bits <<= np.array([0, 4, 8, 12], dtype=np.uint16)
    _scaled_d(np.bitwise_or.reduce(d_bits, axis=1).view(np.float16), 0.125, out["d"])
    _odd_scales(np.stack([(scales >> np.uint16(3 * k)) & np.uint16(7) for k in range(4)], axis=-1),
                out["sub_scales"])
    qs = compact_field(blocks, 0, 32).reshape(-1, 4)
    qh = compact_field(blocks, 32, 48).reshape(-1, 2)
    nibbles = [qh[:, e // 2] >> (4 * (e % 2)) for e in range(4)]
    _pack_codes(out["codes"], _GRIDS[T.IQ1_S], [_high_bits(qs[:, e], nibbles[e], 0, 0x07) for e in range(4)],
                _mark_words(_IQ1_DELTAS, [(nibble >> 3) & 0x01 for nibble in nibbles]))


LATTICE_KERNELS: dict[T, Kernel] = {
    T.IQ2_XXS: _iq2_xxs, T.IQ2_XS: _iq2_xs, T.IQ2_S: _iq2_s, T.IQ3_XXS: _iq3_xxs, T.IQ3_S: _iq3_s,
    T.IQ1_S: _iq1_s, T.IQ1_M: _iq1_m,
}
