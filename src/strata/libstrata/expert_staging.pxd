# Declarations of the prompt path's VRAM expert staging (cuda/include/strata/expert_staging.hpp).
from strata.binding.errors cimport raise_strata_error
from strata.libstrata.expert_pool cimport CppExpertPool


cdef extern from "strata/expert_staging.hpp" nogil:
    cdef cppclass CppExpertStaging "strata::ExpertStaging":
        CppExpertStaging(int device, const CppExpertPool& pool, int slots) except +raise_strata_error
        int slots()
        int n_expert()
        size_t bytes()
        int device()
    size_t cpp_expert_staging_bytes "strata::ExpertStaging::bytes_for"(
        const CppExpertPool& pool, int slots) except +raise_strata_error
