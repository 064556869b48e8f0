# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native: the thin binding over the native core (strata_core).

Every native call that can take time runs with the GIL released; every C++ exception crosses here, once,
into a strata.errors class.
"""
from libcpp.string cimport string

import numpy as np

from strata.errors import InvalidArgument


def device_count() -> int:
    """Number of usable CUDA devices; 0 when there is no driver or no GPU."""
    cdef int count
    with nogil:
        count = cpp_device_count()
    return count


def device_info(int index) -> dict:
    """Name, compute capability, memory and SM count of CUDA device `index`."""
    cdef DeviceInfo info
    with nogil:
        info = cpp_device_info(index)
    return {
        "index": info.index,
        "name": info.name.decode("utf-8", "replace"),
        "compute_capability": (info.cc_major, info.cc_minor),
        "total_memory": info.total_memory,
        "free_memory": info.free_memory,
        "sm_count": info.sm_count,
    }


def driver_version() -> int:
    """CUDA driver version as 1000*major + 10*minor; 0 without a driver."""
    return cpp_driver_version()


def runtime_version() -> int:
    """CUDA runtime version strata was built with, as 1000*major + 10*minor."""
    return cpp_runtime_version()


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
    """Throw the C++ error kind `kind` (test hook for the error path)."""
    cdef string k = kind.encode()
    with nogil:
        cpp_raise_error(k)

# Each room of the core binds itself in its own include file.
include "_native_kernels.pxi"
include "_native_norms.pxi"
include "_native_moe.pxi"
include "_native_sample.pxi"
include "_native_pool.pxi"
include "_native_mixers.pxi"
include "_native_session.pxi"
include "_native_decode.pxi"
