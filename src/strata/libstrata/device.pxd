# Declarations of the CUDA devices (cuda/include/strata/device.hpp).
from libcpp.string cimport string

from strata.binding.errors cimport raise_strata_error


# The core's functions take a cpp_ prefix here so the Python-facing wrappers can keep the plain names.
cdef extern from "strata/device.hpp" nogil:
    cdef cppclass DeviceInfo "strata::DeviceInfo":
        int index
        string name
        int cc_major
        int cc_minor
        size_t total_memory
        size_t free_memory
        int sm_count
    int cpp_device_count "strata::device_count"()
    DeviceInfo cpp_device_info "strata::device_info"(int index) except +raise_strata_error
    int cpp_driver_version "strata::driver_version"()
    int cpp_runtime_version "strata::runtime_version"()
