"""The check every kernel that writes an activation's q8_32 form beside its floats must pass: the form is, bit
for bit, quantize_q8_32 (kernels/quantize.cu, the definition; docs/forms.md) of the kernel's own float output."""

import numpy as np


def assert_q8_of(floats: np.ndarray, q8: tuple, what: str) -> None:
    """q8 = (xq, dx, sums) as a kernel wrote them beside `floats` (any shape; the blocks follow its elements in
    order) against quantize_q8_32 of those floats on the device."""
    from strata import _native_check

    flat = np.ascontiguousarray(floats, dtype=np.float32).reshape(-1)
    assert np.all(np.isfinite(flat)), f"{what}: NaN or infinity in the float output"
    xq, dx, sums = (np.asarray(a).reshape(-1) for a in q8)
    want_xq, want_dx, want_sums = _native_check.quantize_q8_32(flat)
    assert np.array_equal(dx.view(np.uint32), want_dx.view(np.uint32)), \
        f"{what}: dx differs in blocks {np.flatnonzero(dx.view(np.uint32) != want_dx.view(np.uint32))[:8]}"
    assert np.array_equal(xq, want_xq), f"{what}: xq differs at {np.flatnonzero(xq != want_xq)[:8]}"
    assert np.array_equal(sums, want_sums), f"{what}: block sums differ at {np.flatnonzero(sums != want_sums)[:8]}"
