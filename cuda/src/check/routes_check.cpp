#include "strata/check/routes_check.hpp"

#include "../session/experts/chunk_routes.hpp"

namespace strata::routes_check {

Routes group(const std::int32_t* ids, int tokens, int k, int n_expert, const std::vector<int>& cache_slot_of,
             const std::vector<char>& on_cpu, int staging_slots, const std::vector<int>& prefetched) {
  ChunkRoutes routes;
  group_routes(ids, tokens, k, n_expert, cache_slot_of, on_cpu, staging_slots, prefetched, routes);
  Routes out{routes.row_token, routes.row_of, routes.cached_rows, routes.cached_experts, {}, {}, {}};
  auto part = [&](const ChunkRoutes::Part& p) {
    const auto slots = routes.group_slot.begin() + p.first_group;
    const auto begins = routes.group_begin.begin() + p.begin_at;
    out.part_slots.emplace_back(slots, slots + p.groups);
    out.part_begins.emplace_back(begins, begins + p.groups + 1);
  };
  part(routes.cached);
  out.cpu_experts = routes.cpu_experts;
  out.cpu_first = routes.cpu.first_row;
  out.cpu_rows = routes.cpu.rows;
  part(routes.cpu);
  for (const ChunkRoutes::Fill& fill : routes.fills) {
    out.fill_experts.push_back(fill.experts);
    out.fill_first.push_back(fill.first_row);
    out.fill_rows.push_back(fill.rows);
    part(fill.part);
  }
  return out;
}

}  // namespace strata::routes_check
