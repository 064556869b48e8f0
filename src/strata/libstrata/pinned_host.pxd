# Declarations of page-locked host memory (cuda/include/strata/pinned_host.hpp).
from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/pinned_host.hpp" nogil:
    cdef cppclass CppPinnedHost "strata::PinnedHost":
        CppPinnedHost(size_t bytes) except +raise_strata_error
        void* data()
        size_t bytes()
