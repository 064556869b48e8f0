# Declarations of the doctor's self-test (cuda/include/strata/self_test.hpp).
from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/self_test.hpp" nogil:
    double cpp_self_test "strata::self_test"(int device) except +raise_strata_error
