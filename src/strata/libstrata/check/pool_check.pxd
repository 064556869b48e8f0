# Declarations of the CPU pool's kernels on one expert (cuda/include/strata/check/pool_check.hpp).
from libc.stdint cimport int64_t

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.expert_pool cimport ExpertMatrix, Isa


cdef extern from "strata/check/pool_check.hpp" nogil:
    void cpp_expert_matvec "strata::pool_check::expert_matvec"(
        Isa isa, const ExpertMatrix& m, int64_t expert, const float* x, float* y,
        int64_t rows_per_call) except +raise_strata_error
    void cpp_emulated_vnni_matvec "strata::pool_check::emulated_vnni_matvec"(
        const ExpertMatrix& m, int64_t expert, const float* x, float* y,
        int64_t rows_per_call) except +raise_strata_error
    void cpp_expert_hidden "strata::pool_check::expert_hidden"(
        Isa isa, const ExpertMatrix& gate, const ExpertMatrix& up, int64_t expert, const float* x,
        float* h) except +raise_strata_error
    double cpp_time_rows "strata::pool_check::time_rows"(
        Isa isa, const ExpertMatrix& m, const float* x, int64_t rows, int64_t calls) except +raise_strata_error
    void cpp_claim_order "strata::pool_check::claim_order"(
        int64_t items, int parts, int p, int64_t* order) except +raise_strata_error
    void cpp_claim_items "strata::pool_check::claim_items"(
        int64_t items, int parts, int participants, const int* delays_us, int* claimed_by,
        int* claims) except +raise_strata_error
