# The CPU's physical cores as the pool sees them (strata/cpu_topology.hpp).
from strata.libstrata.cpu_topology cimport cpp_physical_cores


def cpu_physical_cores() -> list:
    """Physical cores this process may use, as (SMT sibling CPU ids, NUMA node), ordered by first CPU."""
    cores = cpp_physical_cores()
    return [(tuple(core.cpus), core.node) for core in cores]
