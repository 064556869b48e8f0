# Declarations of the canonical weight form descriptor the kernels and the pool share
# (cuda/include/strata/forms.hpp).
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t


cdef extern from "strata/forms.hpp" namespace "strata" nogil:
    cdef enum class FloatKind "strata::FloatKind":
        F32
        F16
        BF16
    cdef enum class Codebook "strata::Codebook":
        Iq4Nl
        Mxfp4
        Iq2
        Iq3Xxs
        Iq3S
        Iq1
    cdef cppclass QuantForm "strata::QuantForm":
        int32_t code_bits
        int32_t code_bias
        Codebook codebook
        int32_t group_size
        int32_t super_size
        bint scale_f32
        bint has_sub_scales
        bint has_mins
    cdef cppclass QuantPlanes "strata::QuantPlanes":
        const uint8_t* codes
        const void* d
        const int8_t* sub_scales
        const uint16_t* mins
        const uint8_t* sub_mins
