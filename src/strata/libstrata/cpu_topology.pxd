# Declarations of the CPU's physical cores as the pool sees them (cuda/include/strata/cpu_topology.hpp).
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/cpu_topology.hpp" namespace "strata::cpu" nogil:
    cdef cppclass PhysicalCore "strata::cpu::PhysicalCore":
        vector[int] cpus
        int node
    vector[PhysicalCore] cpp_physical_cores "strata::cpu::physical_cores"() except +raise_strata_error
