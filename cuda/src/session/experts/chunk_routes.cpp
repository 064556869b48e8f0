#include "chunk_routes.hpp"

#include <algorithm>
#include <string>

#include "strata/error.hpp"

namespace strata {

void group_routes(const std::int32_t* ids, int tokens, int k, int n_expert, const std::vector<int>& cache_slot_of,
                  const std::vector<char>& on_cpu, int staging_slots, const std::vector<int>& prefetched,
                  ChunkRoutes& out) {
  STRATA_EXPECTS(tokens >= 0 && k >= 1 && n_expert >= 1 && staging_slots >= 1, InvalidArgument,
                 "chunk routes: tokens " + std::to_string(tokens) + ", k " + std::to_string(k) + ", experts " +
                     std::to_string(n_expert) + ", staging slots " + std::to_string(staging_slots));
  STRATA_EXPECTS(cache_slot_of.empty() || static_cast<int>(cache_slot_of.size()) == n_expert, InvalidArgument,
                 "chunk routes: the cache map has " + std::to_string(cache_slot_of.size()) + " experts, the layer " +
                     std::to_string(n_expert));
  STRATA_EXPECTS(on_cpu.empty() || prefetched.empty(), InvalidArgument,
                 "chunk routes: a prefetched fill holds every expert the cache lacks; the CPU takes none of them");
  STRATA_EXPECTS(on_cpu.empty() || static_cast<int>(on_cpu.size()) == n_expert, InvalidArgument,
                 "chunk routes: the CPU's share names " + std::to_string(on_cpu.size()) + " experts, the layer " +
                     std::to_string(n_expert));
  const int pairs = tokens * k;
  // Counting sort by expert: count[e] pairs chose e; rows of expert e start at start[e].
  // Per-expert tallies in the routes' own buffers: a prompt groups every layer of every chunk, and reusing them
  // keeps the host from allocating on each.
  std::vector<int>& count = out.count_;
  count.assign(n_expert, 0);
  for (int p = 0; p < pairs; ++p) {
    const int e = ids[p];
    STRATA_EXPECTS(e >= 0 && e < n_expert, InvalidArgument,
                   "chunk routes: token " + std::to_string(p / k) + " chose expert " + std::to_string(e) +
                       " of a layer of " + std::to_string(n_expert));
    ++count[e];
  }
  auto cached = [&](int e) { return !cache_slot_of.empty() && cache_slot_of[e] >= 0; };
  auto pooled = [&](int e) { return !cached(e) && !on_cpu.empty() && on_cpu[e]; };
  std::vector<int>& start = out.start_;
  std::vector<int>& slot = out.slot_;
  start.assign(n_expert, 0);
  slot.assign(n_expert, -1);
  int row = 0;
  out.cached_experts = 0;
  for (int e = 0; e < n_expert; ++e) {  // the cache's part first
    if (count[e] == 0 || !cached(e)) continue;
    ++out.cached_experts;
    start[e] = row;
    slot[e] = cache_slot_of[e];
    row += count[e];
  }
  out.cached_rows = row;
  out.cpu_experts.clear();
  for (int e = 0; e < n_expert; ++e) {  // then the pool's
    if (count[e] == 0 || !pooled(e)) continue;
    out.cpu_experts.push_back(e);
    start[e] = row;
    row += count[e];
  }
  const int cpu_first = out.cached_rows, cpu_rows = row - cpu_first;
  out.fills.clear();
  if (!prefetched.empty()) {
    ChunkRoutes::Fill fill;
    fill.experts = prefetched;
    fill.first_row = row;
    for (int i = 0; i < static_cast<int>(prefetched.size()); ++i) slot[prefetched[i]] = i;
    for (int e = 0; e < n_expert; ++e) {
      if (count[e] == 0 || cached(e) || pooled(e)) continue;
      STRATA_EXPECTS(slot[e] >= 0, InvalidArgument,
                     "chunk routes: expert " + std::to_string(e) + " is routed but neither cached nor prefetched");
      start[e] = row;
      row += count[e];
    }
    fill.rows = row - fill.first_row;
    out.fills.push_back(std::move(fill));
  } else {
    for (int e = 0; e < n_expert; ++e) {
      if (count[e] == 0 || cached(e) || pooled(e)) continue;
      if (out.fills.empty() || static_cast<int>(out.fills.back().experts.size()) == staging_slots) {
        out.fills.emplace_back();
        out.fills.back().first_row = row;
      }
      ChunkRoutes::Fill& fill = out.fills.back();
      slot[e] = static_cast<int>(fill.experts.size());
      fill.experts.push_back(e);
      start[e] = row;
      row += count[e];
      fill.rows += count[e];
    }
  }
  // The groups of each part, in row order: one per routed expert, its begin relative to the part's first row.
  out.group_slot.clear();
  out.group_begin.clear();
  auto part_of = [&](int first_row, int rows, const std::vector<int>& experts) {
    ChunkRoutes::Part part{first_row, rows, static_cast<int>(out.group_slot.size()), 0,
                           static_cast<int>(out.group_begin.size())};
    for (const int e : experts) {
      if (count[e] == 0) continue;
      out.group_slot.push_back(slot[e]);
      out.group_begin.push_back(start[e] - first_row);
      ++part.groups;
    }
    out.group_begin.push_back(rows);
    return part;
  };
  std::vector<int>& held = out.held_;
  held.clear();
  for (int e = 0; e < n_expert; ++e) {
    if (count[e] > 0 && cached(e)) held.push_back(e);
  }
  out.cached = part_of(0, out.cached_rows, held);
  out.cpu = part_of(cpu_first, cpu_rows, out.cpu_experts);
  for (ChunkRoutes::Fill& fill : out.fills) fill.part = part_of(fill.first_row, fill.rows, fill.experts);
  out.row_token.resize(pairs);
  out.row_of.resize(pairs);
  for (int p = 0; p < pairs; ++p) {  // pair order is token order, so each expert's rows keep it
    const int e = ids[p], r = start[e]++;
    out.row_token[r] = p / k;
    out.row_of[p] = r;
  }
}

}  // namespace strata
