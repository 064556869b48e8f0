#pragma once

#include <cstdint>

#include "worker_team.hpp"

namespace strata::cpu {

// Best bytes/s of `team` reading a `bytes` buffer (each worker its own slice, first-touched by that worker
// so the pages sit on its NUMA node), over `reps` timed passes.
double measure_read_bandwidth(WorkerTeam& team, int64_t bytes, int reps);

}  // namespace strata::cpu
