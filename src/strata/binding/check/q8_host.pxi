# A kernel's q8_32 output on the host (strata/check/q8_host.hpp): the arrays a round trip fills beside its floats.
from libc.stdint cimport int8_t, int32_t

from strata.libstrata.check.q8_host cimport Q8Host


def _q8_arrays(int rows, long n):
    """Host arrays for the q8_32 form of `rows` rows of n floats that a kernel writes beside its floats:
    (xq int8 [rows, n], dx float32 [rows, n // 32], sums int32 [rows, n // 32])."""
    return np.empty((rows, n), np.int8), np.empty((rows, n // 32), np.float32), np.empty((rows, n // 32), np.int32)


cdef Q8Host _q8_host(arrays) except *:
    """The addresses of _q8_arrays' arrays; all null for None (the kernel is asked for no q8_32 form)."""
    cdef Q8Host host
    cdef int8_t[:, ::1] xq
    cdef float[:, ::1] dx
    cdef int32_t[:, ::1] sums
    if arrays is not None:
        xq, dx, sums = arrays
        host.xq = &xq[0, 0]
        host.dx = &dx[0, 0]
        host.sums = &sums[0, 0]
    return host


def _flat_q8(arrays) -> tuple:
    """One row of _q8_arrays as 1-D arrays."""
    return tuple(a.reshape(-1) for a in arrays)
