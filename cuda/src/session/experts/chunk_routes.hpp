// One layer's routing of a prompt chunk, grouped for the products (docs/prompt.md): each routed expert is
// computed once for all the tokens that chose it, so the (token, choice) pairs become product rows grouped by
// expert, first those of experts the VRAM cache holds, then those the CPU pool computes, then those of the experts
// the staging holds, fill by fill.
// Host-only, deterministic: the rows of one expert keep token order, experts ascend within each part.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct ChunkRoutes {
  // Consecutive product rows read from one stack of experts (the cache's, or one staging fill's), as groups of
  // one expert each: group i of the part is rows group_begin[begin_at + i] .. group_begin[begin_at + i + 1] - 1,
  // counted from first_row, of the expert in slot group_slot[first_group + i].
  struct Part {
    int first_row = 0, rows = 0;
    int first_group = 0, groups = 0, begin_at = 0;
  };
  // One staging fill: the experts it copies (ascending) and the rows that read them.
  struct Fill {
    std::vector<int> experts;
    int first_row = 0, rows = 0;
    Part part;
  };
  std::vector<int> row_token;  // [P] the token of each product row
  std::vector<int> row_of;     // [tokens * k] the product row of choice j of token t (t * k + j)
  int cached_rows = 0;         // rows [0, cached_rows) read the VRAM cache
  int cached_experts = 0;      // distinct routed experts the cache holds
  Part cached;                 // those rows as groups
  Part cpu;                    // then the rows of the experts the CPU pool computes
  std::vector<int> cpu_experts;  // the expert of each of the cpu part's groups
  std::vector<int> group_slot, group_begin;  // every part's groups, in row order
  std::vector<int> count_, start_, slot_, held_;  // group_routes' per-expert scratch, kept between calls
  std::vector<Fill> fills;     // the rest, in order
};

// Groups `ids` ([tokens][k], ids in 0..n_expert-1). cache_slot_of: per expert its VRAM cache slot or -1 (empty:
// no cache). on_cpu: per expert whether the CPU pool computes it (empty: none; the cache's experts stay the
// cache's). The others go to fills of at most `staging_slots` experts each; with `prefetched` (the experts a fill
// already holds or is copying, ascending), they must all be in it and form the one fill. InvalidArgument on an id
// out of range or a routed expert the prefetched fill lacks.
void group_routes(const std::int32_t* ids, int tokens, int k, int n_expert, const std::vector<int>& cache_slot_of,
                  const std::vector<char>& on_cpu, int staging_slots, const std::vector<int>& prefetched,
                  ChunkRoutes& out);

}  // namespace strata
