# Declarations of the session arena's bytes, poisoned and read back
# (cuda/include/strata/check/arena_check.hpp).
from strata.binding.errors cimport raise_strata_error
from strata.libstrata.session_arena cimport CppSessionArena


cdef extern from "strata/check/arena_check.hpp" nogil:
    void cpp_arena_download "strata::arena_check::download"(
        const CppSessionArena& arena, void* host) except +raise_strata_error
    void cpp_arena_fill "strata::arena_check::fill"(
        CppSessionArena& arena, unsigned char byte) except +raise_strata_error
