# Declarations of the expert cache's replacement policy (cuda/include/strata/expert_policy.hpp).
from libc.stdint cimport int32_t
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/expert_policy.hpp" nogil:
    cdef cppclass PolicyOptions "strata::PolicyOptions":
        cbool replace
        int admit_after, window, max_copies

    cdef cppclass ExpertMove "strata::ExpertMove":
        int layer, slot, expert, evicted

    cdef cppclass CppReplacementPolicy "strata::ReplacementPolicy":
        CppReplacementPolicy(const vector[int]& slots, int n_expert,
                             const PolicyOptions& options) except +raise_strata_error
        void hold(int layer, const vector[int]& experts) except +raise_strata_error
        int note(int layer, const int32_t* ids, int k) except +raise_strata_error
        vector[ExpertMove] plan() except +raise_strata_error
        void complete(const ExpertMove& move) except +raise_strata_error
        int slot_of(int layer, int expert) except +raise_strata_error
