# Declarations of the prompt path's grouping of a chunk's routing
# (cuda/include/strata/check/routes_check.hpp).
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/check/routes_check.hpp" nogil:
    cdef cppclass ChunkRoutes "strata::routes_check::Routes":
        vector[int] row_token, row_of
        int cached_rows, cached_experts
        vector[vector[int]] fill_experts
        vector[int] fill_first, fill_rows
        vector[vector[int]] part_slots, part_begins
        vector[int] cpu_experts
        int cpu_first, cpu_rows

    ChunkRoutes cpp_group_routes "strata::routes_check::group"(
        const int32_t* ids, int tokens, int k, int n_expert, const vector[int]& cache_slot_of,
        const vector[char]& on_cpu, int staging_slots, const vector[int]& prefetched) except +raise_strata_error
