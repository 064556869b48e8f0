# Declarations of GEMVs over uploaded weights (cuda/include/strata/check/weights_check.hpp).
from libcpp.string cimport string

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.device_weights cimport CppDeviceWeights


cdef extern from "strata/check/weights_check.hpp" nogil:
    void cpp_weights_gemv "strata::weights_check::gemv"(
        const CppDeviceWeights& weights, const string& name, const float* x, float* y) except +raise_strata_error
