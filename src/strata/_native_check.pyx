# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native_check: the test hooks' binding (development and test builds only; wheels leave it out).

Round trips of single kernels and of the CPU pool's kernels, the expert exchange through the session's token
schedule, and checks over the production objects of strata._native; every one allocates and synchronises, and
none is on the token path. Errors cross as in strata._native.
"""
import numpy as np

from strata.errors import InvalidArgument

from libcpp.string cimport string

from strata._native_check_kernels cimport cpp_raise_error, cpp_rms_norm


def rms_norm(x, w, float eps, int device=0):
    """RMSNorm of each row of x (float32 [rows, cols]) times w (float32 [cols]), on GPU `device`."""
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
    with nogil:
        cpp_rms_norm(device, &xv[0, 0], &wv[0], &yv[0, 0], r, c, eps)
    return out


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
