# Declarations of the host side of a kernel's q8_32 output (cuda/include/strata/check/q8_host.hpp).
from libc.stdint cimport int8_t, int32_t


cdef extern from "strata/check/q8_host.hpp" nogil:
    cdef cppclass Q8Host "strata::kernel_check::Q8Host":
        int8_t* xq
        float* dx
        int32_t* sums
