# `strata doctor`'s self-test (strata/self_test.hpp).
from strata.libstrata.self_test cimport cpp_self_test


def self_test(int device) -> float:
    """`strata doctor`'s self-test on GPU `device`: RMSNorm of fresh random rows against the host in float64;
    the largest error relative to the largest output (inf if any output is not finite)."""
    cdef double error
    with nogil:
        error = cpp_self_test(device)
    return error
