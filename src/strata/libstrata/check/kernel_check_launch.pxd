# Declarations of the launch chain check (cuda/include/strata/check/kernel_check_launch.hpp).
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/check/kernel_check_launch.hpp" nogil:
    cdef enum class LaunchChainStream "strata::kernel_check::LaunchChainStream":
        Owned
        Legacy
        Captured

    vector[int] cpp_launch_chain "strata::kernel_check::launch_chain"(
        int device, int links, int cells, long long spin_ns, LaunchChainStream where) except +raise_strata_error
