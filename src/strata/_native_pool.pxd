# Declarations of the CPU expert pool's types (cuda/include/strata/expert_pool.hpp, cpu_topology.hpp); the
# functions are declared in _native_pool.pxi. The form descriptor is the kernels' (strata/forms.hpp).
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libcpp cimport bool
from libcpp.vector cimport vector

from _native_kernels cimport QuantForm


cdef extern from "strata/cpu_topology.hpp" namespace "strata::cpu" nogil:
    cdef cppclass PhysicalCore "strata::cpu::PhysicalCore":
        vector[int] cpus
        int node


cdef extern from "strata/expert_pool.hpp" namespace "strata::cpu" nogil:
    cdef enum class Isa "strata::cpu::Isa":
        kAuto
        kAvx2
        kAvx512
    bool cpp_cpu_has_avx2 "strata::cpu::cpu_has_avx2"()
    bool cpp_cpu_has_avx512_vnni "strata::cpu::cpu_has_avx512_vnni"()

    cdef cppclass Plane "strata::cpu::Plane":
        const void* data
        int64_t nbytes

    cdef cppclass ExpertMatrix "strata::cpu::ExpertMatrix":
        QuantForm form
        int64_t n_expert
        int64_t rows
        int64_t cols
        Plane codes
        Plane d
        Plane sub_scales
        Plane mins
        Plane sub_mins

    cdef cppclass PoolOptions "strata::cpu::PoolOptions":
        int threads
        bool smt
        bool pin_caller
        Isa isa
        int spin_us
