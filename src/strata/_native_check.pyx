# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native_check: the test hooks' binding (development and test builds only; wheels leave it out).

Round trips of single kernels and of the CPU pool's kernels, the expert exchange through the session's token
schedule, and checks over the production objects of strata._native; every one allocates and synchronises, and
none is on the token path. Errors cross as in strata._native.
"""
import numpy as np

from strata.errors import InvalidArgument

from libcpp.string cimport string

from libc.stdint cimport int8_t, int32_t

from strata._native_check_kernels cimport Q8Host, cpp_raise_error, cpp_rms_norm


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


def rms_norm(x, w, float eps, int device=0, bint q8=False):
    """RMSNorm of each row of x (float32 [rows, cols]) times w (float32 [cols]), on GPU `device`. With q8 also the
    kernel's q8_32 form of the output (cols a multiple of 32): returns (out, (xq, dx, sums)) over rows * cols."""
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef const float[::1] wv = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = xv.shape[0], xv.shape[1]
    if wv.shape[0] != cols:
        raise InvalidArgument(f"rms_norm: weight has {wv.shape[0]} entries, rows have {cols}")
    if rows == 0 or cols == 0:
        raise InvalidArgument(f"rms_norm: empty input of shape ({rows}, {cols})")
    out = np.empty((rows, cols), dtype=np.float32)
    cdef float[:, ::1] yv = out
    cdef int r = rows, c = cols
    q8_arrays = _q8_arrays(1, rows * cols) if q8 else None
    cdef Q8Host q8_host = _q8_host(q8_arrays)
    with nogil:
        cpp_rms_norm(device, &xv[0, 0], &wv[0], &yv[0, 0], r, c, eps, q8_host)
    return (out, _flat_q8(q8_arrays)) if q8 else out


def raise_error(str kind) -> None:
    """Throw the C++ error kind `kind` ("invalid_argument", "out_of_memory", "format", "cuda", "error"), so tests
    can prove that each arrives as the right strata.errors class."""
    cdef string k = kind.encode()
    with nogil:
        cpp_raise_error(k)

# Each room of the test hooks binds itself in its own include file; its declarations are in the room's .pxd.
include "_native_check_kernels.pxi"
include "_native_check_matmul.pxi"
include "_native_check_norms.pxi"
include "_native_check_moe.pxi"
include "_native_check_sample.pxi"
include "_native_check_mixers.pxi"
include "_native_check_attention_chunk.pxi"
include "_native_check_kv_window.pxi"
include "_native_check_session.pxi"
include "_native_check_pool.pxi"
