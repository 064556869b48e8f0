# Declarations of the PLE layer's native row gather (cuda/include/strata/ple_gather.hpp).
from libc.stdint cimport int64_t, uint64_t
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.file_rows cimport CppFileRows


cdef extern from "strata/ple_gather.hpp" nogil:
    cdef enum class PleRowType "strata::PleRowType":
        F32
        F16
        BF16
        Q8_0

    cdef cppclass PleTable "strata::PleTable":
        CppFileRows* rows
        int head_dim
        PleRowType row_type

    cdef cppclass PleHash "strata::PleHash":
        int ngram, heads_per_ngram
        int64_t eos
        vector[uint64_t] multipliers, head_sizes, head_offsets

    cdef cppclass CppPleNgrams "strata::PleNgrams":
        CppPleNgrams(PleHash hash) except +raise_strata_error
        int n_heads()
        void next(int64_t token, uint64_t* rows)
        void reset()
        const vector[int64_t]& previous()
        void set_previous(const vector[int64_t]& ids) except +raise_strata_error

    cdef cppclass CppPleGather "strata::PleGather":
        CppPleGather(const PleTable& table, PleHash hash) except +raise_strata_error
        int n_heads()
        int head_dim()
        int width()
        void rows(int64_t token, float* out) except +raise_strata_error
        void reset()
        const vector[int64_t]& previous()
        void set_previous(const vector[int64_t]& ids) except +raise_strata_error
