# Declarations only: the C++ API of strata_core that the binding uses. Definitions live in _native.pyx.
from libcpp.string cimport string


# The `except +` handler of every native call (see _native_errors.hpp). Pure extern: a room's .pxd may
# cimport it without making the module import anything at load time.
cdef extern from "_native_errors.hpp" namespace "strata_binding":
    int raise_strata_error() except -1


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


cdef extern from "strata/kernel_check.hpp" nogil:
    void cpp_rms_norm "strata::kernel_check::rms_norm"(int device, const float* x, const float* w,
                                                     float* y, int rows, int cols, float eps) except +raise_strata_error
    void cpp_raise_error "strata::kernel_check::raise_error"(const string& kind) except +raise_strata_error
