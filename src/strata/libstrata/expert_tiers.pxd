# Declarations of the routed experts' tiers below VRAM (cuda/include/strata/expert_tiers.hpp).
from libc.stdint cimport int64_t
from libcpp cimport bool as cbool
from libcpp.vector cimport vector


cdef extern from "strata/expert_tiers.hpp" namespace "strata::cpu" nogil:
    cdef enum class BlockType "strata::cpu::BlockType":
        pass
    cbool cpp_block_type_supported "strata::cpu::block_type_supported"(int type)

    cdef cppclass FileMatrix "strata::cpu::FileMatrix":
        int64_t offset
        int64_t expert_stride
        BlockType type

    cdef cppclass TierPolicy "strata::cpu::TierPolicy":
        cbool replace
        int admit_after, window, max_moves

    cdef cppclass TierLayerStats "strata::cpu::TierLayerStats":
        int layer, slots
        int64_t hits, misses, moves, bytes_read
        vector[int] experts
