// A chain of kernels launched through kernels/launch.cuh (programmatic dependent launch from sm_90), each reading
// what the one before it wrote: stream order must hold on an owned stream, on the legacy default stream and in a
// captured graph. Not for the token path: it allocates and synchronises. Host-only header (no CUDA types).
#pragma once

#include <vector>

namespace strata::kernel_check {

// Where the chain runs: an owned non-blocking stream, the legacy default stream (the kernel checks' own), or
// captured from an owned stream into a graph replayed once.
enum class LaunchChainStream { Owned, Legacy, Captured };

// `links` kernels over `cells` counters zeroed first; each kernel reads every counter, spins `spin_ns` of the GPU's
// global timer, then writes the counter it read plus one. A kernel that ran before its predecessor's writes landed
// loses them, so every returned counter equals `links` only where each kernel saw the one before it complete.
std::vector<int> launch_chain(int device, int links, int cells, long long spin_ns, LaunchChainStream where);

}  // namespace strata::kernel_check
