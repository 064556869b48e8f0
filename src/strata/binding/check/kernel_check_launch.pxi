# A chain of kernels under programmatic dependent launch (strata::kernel_check, kernel_check_launch.hpp): stream
# order on an owned stream, the legacy default stream and a captured graph. For tests only.
from libcpp.vector cimport vector

from strata.libstrata.check.kernel_check_launch cimport LaunchChainStream, cpp_launch_chain

_LAUNCH_CHAIN_STREAMS = {"owned": LaunchChainStream.Owned, "legacy": LaunchChainStream.Legacy,
                         "captured": LaunchChainStream.Captured}


def launch_chain(str where, *, int links, int cells, long long spin_ns, int device=0):
    """Run `links` kernels through strata's launch over `cells` counters, each adding one to what the kernel before
    it wrote, after a spin of `spin_ns`; `where` is "owned" (a stream of its own), "legacy" (the default stream) or
    "captured" (a graph). Returns the counters, int32 [cells]: `links` each where stream order held."""
    if where not in _LAUNCH_CHAIN_STREAMS:
        raise InvalidArgument(f"launch_chain: where must be one of {sorted(_LAUNCH_CHAIN_STREAMS)}, got {where!r}")
    cdef LaunchChainStream stream = _LAUNCH_CHAIN_STREAMS[where]
    cdef vector[int] counters
    with nogil:
        counters = cpp_launch_chain(device, links, cells, spin_ns, stream)
    return np.array(counters, dtype=np.int32)
