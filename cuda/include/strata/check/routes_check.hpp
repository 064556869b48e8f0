// The prompt path's grouping of a chunk's routing (cuda/src/session/experts/chunk_routes.hpp) from outside the core, for
// tests on the host: no device involved.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::routes_check {

struct Routes {
  std::vector<int> row_token, row_of;
  int cached_rows = 0, cached_experts = 0;
  std::vector<std::vector<int>> fill_experts;
  std::vector<int> fill_first, fill_rows;
  std::vector<int> cpu_experts;
  int cpu_first = 0, cpu_rows = 0;
  // Per part (the cache's, the CPU's, then each fill's): its groups' slots and begins (relative to the part's
  // first row).
  std::vector<std::vector<int>> part_slots, part_begins;
};

Routes group(const std::int32_t* ids, int tokens, int k, int n_expert, const std::vector<int>& cache_slot_of,
             const std::vector<char>& on_cpu, int staging_slots, const std::vector<int>& prefetched);

}  // namespace strata::routes_check
