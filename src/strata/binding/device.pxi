# The CUDA devices strata may run on (strata/device.hpp) and the CUDA versions it runs with.
from strata.libstrata.device cimport (
    DeviceInfo, cpp_device_count, cpp_device_info, cpp_driver_version, cpp_runtime_version,
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
