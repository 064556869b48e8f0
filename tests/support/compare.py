"""Comparisons of results with their oracles: bit for bit, or within a relative error the caller states.

NaN never passes either: a NaN (or an infinity, unless the caller says it may be one) fails with a count of
them, since unwritten rows and poisoned guard bands are NaN, and an error with NaN in it compares False both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str, *, dtype: type = np.float32,
                     infinities: bool = False, poisoned: bool = False) -> None:
    """got and want are `dtype` arrays of one shape holding the same bits, element for element.

    A NaN fails even where both sides hold the same one, and so does an infinity unless `infinities` (values that
    may overflow, as a float16 table's). `poisoned`: cells that neither side writes hold a NaN poison, which must
    then match bit for bit like any other.
    """
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.dtype == want.dtype == dtype, f"{what}: dtypes {got.dtype} and {want.dtype}, not {np.dtype(dtype)}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if not poisoned:
        _assert_finite(want, f"{what}: the oracle", infinities)
        _assert_finite(got, what, infinities)
    unsigned = np.dtype(f"u{got.dtype.itemsize}")
    differ = got.view(unsigned) != want.view(unsigned)
    if not differ.any():
        return
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    rows = np.flatnonzero(differ.reshape(len(differ), -1).any(axis=1))[:8].tolist() if got.ndim > 1 else None
    rows = f" in rows {rows}" if rows else ""
    raise AssertionError(f"{what}: {np.count_nonzero(differ)} of {got.size} elements differ{rows}, first at {first}: "
                         f"{got[first]!r} != {want[first]!r}{_largest_relative(got, want)}")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|, in float64; a non-finite element of got fails, and so does a want of zeros,
    which gives no scale."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    _assert_finite(got, "the result")
    scale = np.max(np.abs(want))
    assert scale > 0, "the oracle is all zeros: a relative error has no scale"
    return float(np.max(np.abs(got - want)) / scale)


def relative_errors(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> np.ndarray:
    """relative_error of each pair (of each row, for 2-D arrays): e.g. the logits of each token."""
    assert len(got) == len(want), f"{len(got)} results against {len(want)} oracles"
    return np.array([relative_error(g, w) for g, w in zip(got, want)])


def qsa_cut_tie(blocks: Sequence[int], scores: np.ndarray) -> bool:
    """Whether an exact score tie sits at a QSA row's top-k cut, so that tie-breaking chose its blocks.

    A block that every indexer head meets with q.k <= 0 scores exactly 0 (relu per head), so a row with fewer
    positive blocks than its budget ties at 0: a legitimate draw, but one whose selection torch.topk's tie order
    decides (docs/models/qwen4exp.md, section 5), where the reference keeps the lower index.
    """
    keep = len(blocks)
    if not 0 < keep < len(scores):
        return False
    ordered = np.sort(scores)[::-1]
    return bool(ordered[keep - 1] == ordered[keep])


def _assert_finite(x: np.ndarray, what: str, infinities: bool = False) -> None:
    bad = np.isnan(x) if infinities else ~np.isfinite(x)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        kind = "NaN" if infinities else "NaN or infinite"
        raise AssertionError(f"{what}: {np.count_nonzero(bad)} of {x.size} elements are {kind}, first at {first}")


def _largest_relative(got: np.ndarray, want: np.ndarray) -> str:
    if not (np.isfinite(got).all() and np.isfinite(want).all() and np.any(want)):
        return ""
    return f" (max relative error {relative_error(got, want):.2e})"
