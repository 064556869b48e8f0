# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native: the thin binding over the native core (strata_core).

Every native call that can take time runs with the GIL released, construction and destruction included;
every native object is owned through a unique_ptr; every C++ exception crosses here, once, into a
strata.errors class. The test hooks are another extension, strata._native_check, which wheels leave out.
"""
import numpy as np

from strata.errors import InvalidArgument
from strata.options import KV, Mode

from strata._native_device cimport (
    DeviceInfo, cpp_device_count, cpp_device_info, cpp_driver_version, cpp_runtime_version, cpp_self_test,
)


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


def self_test(int device) -> float:
    """`strata doctor`'s self-test on GPU `device`: RMSNorm of fresh random rows against the host in float64;
    the largest error relative to the largest output (inf if any output is not finite)."""
    cdef double error
    with nogil:
        error = cpp_self_test(device)
    return error

# Each room of the core binds itself in its own include file; its declarations are in the room's .pxd.
include "_native_forms.pxi"
include "_native_pool.pxi"
include "_native_weights.pxi"
include "_native_ple.pxi"
include "_native_session.pxi"
include "binding/machine_rates.pxi"
