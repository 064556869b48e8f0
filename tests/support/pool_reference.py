"""What the CPU pool's products are checked against: the numpy reference of strata.quant, with a stated bound.

Quantized forms: strata.quant.matvec applies the same q8_32 activation contract and agrees on every integer
inner sum; the kernels only reorder float32 sums (lanes, FMA, offsets folded per row) against numpy's
per-group order: a few ulp of the largest partial sums over at most 80 blocks, far below 1e-5 of max|y|.

Float forms: every weight widens to float32 exactly and meets float32 x in an FMA. Every kernel sums a row
in at least 32 partial sums (four accumulators of 8 or 16 lanes), so each rounding chain is at most cols / 32
FMAs, followed by at most 6 levels of additions (accumulators, then lanes) and the scale's product: depth
d <= cols / 32 + 7. Whatever the data, |got - exact| <= gamma_d * sum_i |w_i x_i| with
gamma_d = d u / (1 - d u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); the exact
value is float64 here (its own error, cols * 2^-53 of the same sum, is 1e-7 of the bound). A kernel that
quantized x or h (to 1/254 of a block's range) misses this bound by orders of magnitude.
"""

from __future__ import annotations

import numpy as np

from strata.quant import QuantTensor, dequantize, matvec
from support.compare import relative_error

RTOL = 1e-5
Weight = QuantTensor | np.ndarray


def float_bound(cols: int) -> float:
    """gamma_d of a float row of `cols` columns, with one level of depth to spare."""
    d = cols // 32 + 8
    u = 2.0**-24
    return d * u / (1 - d * u)


def check_product(got: np.ndarray, w: Weight, x: np.ndarray, scale: float, what: str) -> None:
    """got == scale * (w x) for one expert's matrix w (as repack makes it) within the bound of its form."""
    assert np.all(np.isfinite(got)), f"non-finite output: {what}"
    if isinstance(w, QuantTensor):
        assert relative_error(got, np.float32(scale) * matvec(w, x)) < RTOL, what
        return
    w64, x64 = dequantize(w).astype(np.float64), np.asarray(x, np.float64)
    want = scale * (w64 @ x64)
    bound = float_bound(w64.shape[1]) * abs(scale) * (np.abs(w64) @ np.abs(x64))
    worst = int(np.argmax(np.abs(got - want) - bound))
    assert np.all(np.abs(got - want) <= bound), (
        f"{what}: row {worst} is {got[worst]!r}, float64 {want[worst]!r}, bound {bound[worst]:.3g}")


def silu(g: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-g) = inf for very negative g gives silu = -0, as it should
        return (g.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32)


def check_expert(isa: str, gate: Weight, up: Weight, down: Weight, x: np.ndarray, weight: float, out: np.ndarray,
                 what: str) -> None:
    """One pool answer row `out` = weight * down(silu(gate x) * up x) of one expert, checked half by half: gate
    and up by the pool's kernels against the reference, h by the job's own code, then down from that h."""
    from strata import _native_check  # the test hooks; modules that call this skip without them

    g = _native_check.expert_matvec(isa, gate, x)
    u = _native_check.expert_matvec(isa, up, x)
    check_product(g, gate, x, 1.0, f"gate ({what})")
    check_product(u, up, x, 1.0, f"up ({what})")
    h = _native_check.expert_hidden(isa, gate, up, x)  # the job's code, bit for bit
    # silu in float32 (native expf) vs float64 here: an ulp or two of each h.
    assert relative_error(h, silu(g) * u) < RTOL, f"h ({what})"
    # The reference takes the pool's h, so a quantized down sees the same q8_32 of h on both sides.
    check_product(out, down, h, weight, f"out ({what})")
