# Declarations of the test hooks over the session's pieces: the expert exchange through the token schedule,
# GEMVs over uploaded weights, the arena's bytes (cuda/include/strata/check/exchange_check.hpp,
# weights_check.hpp, arena_check.hpp). Bound in _native_check_session.pxi.
from libc.stdint cimport int32_t, uint64_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata._native_errors cimport raise_strata_error
from strata._native_pool cimport CppExpertPool
from strata._native_session cimport CppSessionArena, DecodeMode
from strata._native_weights cimport CppDeviceWeights


cdef extern from "strata/check/exchange_check.hpp" nogil:
    cdef cppclass ExchangeFaults "strata::exchange_check::Faults":
        int never_ring_layer
        int never_answer_layer
        uint64_t first_token

    cdef cppclass ExchangeTiming "strata::exchange_check::Timing":
        double seconds_per_token
        double ring_wait_seconds
        double pool_seconds
        long rings

    ExchangeTiming cpp_exchange_run "strata::exchange_check::run"(
        CppExpertPool& pool, int device, DecodeMode mode, int n_layer, int n, int k, const float* x,
        const int32_t* ids, const float* weights, int tokens, float* out, const ExchangeFaults& faults,
        double timeout_seconds) except +raise_strata_error


cdef extern from "strata/check/weights_check.hpp" nogil:
    void cpp_weights_gemv "strata::weights_check::gemv"(
        const CppDeviceWeights& weights, const string& name, const float* x, float* y) except +raise_strata_error


cdef extern from "strata/check/arena_check.hpp" nogil:
    void cpp_arena_download "strata::arena_check::download"(
        const CppSessionArena& arena, void* host) except +raise_strata_error
    void cpp_arena_fill "strata::arena_check::fill"(
        CppSessionArena& arena, unsigned char byte) except +raise_strata_error


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
