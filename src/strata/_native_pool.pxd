# Declarations of the CPU expert pool's types (cuda/include/strata/expert_pool.hpp, cpu_topology.hpp). The
# functions that throw are declared in _native_pool.pxi, next to raise_strata_error's scope: cimporting it
# here would make the module import a separate top-level `_native` at load time.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libcpp cimport bool
from libcpp.vector cimport vector


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

    cdef cppclass FormDesc "strata::cpu::FormDesc":
        int code_bits
        int code_bias
        bool has_codebook
        int8_t codebook[16]
        int group_size
        int super_size
        bool scale_f32
        bool has_sub_scales
        bool has_mins

    cdef cppclass Plane "strata::cpu::Plane":
        const void* data
        int64_t nbytes

    cdef cppclass ExpertMatrix "strata::cpu::ExpertMatrix":
        FormDesc form
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
