# Declarations of the VRAM expert cache (cuda/include/strata/expert_cache.hpp).
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.expert_policy cimport PolicyOptions
from strata.libstrata.expert_pool cimport CppExpertPool


cdef extern from "strata/expert_cache.hpp" nogil:
    cdef cppclass CppExpertCache "strata::ExpertCache":
        CppExpertCache(int device, CppExpertPool& pool, const vector[int]& slots,
                       const PolicyOptions& policy) except +raise_strata_error
        void hold(int layer, const vector[int]& experts) except +raise_strata_error
        int layers()
        int slots(int layer) except +raise_strata_error
        cbool holds(int layer, int expert)
        cbool holds_all(int layer)
        vector[int] held(int layer) except +raise_strata_error
        size_t bytes()
        int device()
    size_t cpp_expert_cache_bytes "strata::ExpertCache::bytes_for"(
        const CppExpertPool& pool, const vector[int]& slots) except +raise_strata_error
