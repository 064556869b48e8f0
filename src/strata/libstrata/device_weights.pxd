# Declarations of a model's dense weights in VRAM (cuda/include/strata/device_weights.hpp).
from libc.stdint cimport int64_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.forms cimport FloatKind, QuantForm


cdef extern from "strata/device_weights.hpp" nogil:
    cdef cppclass HostTensor "strata::HostTensor":
        string name
        bint is_float
        FloatKind float_kind
        QuantForm form
        int64_t rows
        int64_t cols
        const void* planes[5]
        size_t plane_bytes[5]

    cdef cppclass DeviceTensor "strata::DeviceTensor":
        int64_t rows
        int64_t cols

    cdef cppclass CppDeviceWeights "strata::DeviceWeights":
        CppDeviceWeights(int device, const vector[HostTensor]& tensors) except +raise_strata_error
        size_t bytes()
        bint has(const string& name)
        const DeviceTensor& get(const string& name) except +raise_strata_error
