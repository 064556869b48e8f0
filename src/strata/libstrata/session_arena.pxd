# Declarations of the session's arena (cuda/include/strata/session_arena.hpp).
from strata.binding.errors cimport raise_strata_error
from strata.libstrata.session_layout cimport SessionLayout


cdef extern from "strata/session_arena.hpp" nogil:
    cdef cppclass CppSessionArena "strata::SessionArena":
        CppSessionArena(int device, SessionLayout layout) except +raise_strata_error
        void reset() except +raise_strata_error
        void snapshot(int slot) except +raise_strata_error
        void restore(int slot) except +raise_strata_error
        const SessionLayout& layout()
