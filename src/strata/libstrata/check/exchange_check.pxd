# Declarations of the GPU <-> CPU expert exchange run through the session's token schedule
# (cuda/include/strata/check/exchange_check.hpp).
from libc.stdint cimport int32_t, uint64_t

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.decode_session cimport DecodeMode
from strata.libstrata.expert_pool cimport CppExpertPool


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
