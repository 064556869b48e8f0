#pragma once

#include <cstdint>

#include "strata/expert_pool.hpp"
#include "worker_team.hpp"

namespace strata::cpu {

// Best bytes/s of `team` reading a `bytes` buffer (each worker its own slice, first-touched by that worker
// so the pages sit on its NUMA node), over `reps` timed passes of each way of reading it that `isa` has: the
// honest ceiling, which no pool job should beat (see read_bandwidth.cpp for what the box rewards).
double measure_read_bandwidth(WorkerTeam& team, Isa isa, int64_t bytes, int reps);

// One worker's pass over `bytes` of `slice` (64-byte aligned) with the ISA's widest loads, eight streams, and
// optionally a software prefetch ahead of each (read_stream.inl); returns a sum so the loads stay.
uint64_t read_slice_avx2(const uint8_t* slice, int64_t bytes, bool prefetch);
uint64_t read_slice_avx512(const uint8_t* slice, int64_t bytes, bool prefetch);

}  // namespace strata::cpu
