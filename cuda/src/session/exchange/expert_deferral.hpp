// Expert deferral (docs/session.md, "Expert deferral"): of a ringing layer's routed experts, the `experts` of
// lowest routing weight that the CPU pool computes reach the streams one layer late, so that the pool computes
// them while the GPU runs the next layer. The one rule the host loop and the decode program both follow.
#pragma once

#include "strata/expert_cache.hpp"

namespace strata {

// Whether layer `layer` rings the doorbell: some of its experts are the pool's (`cache` may be null).
inline bool layer_rings(const ExpertCache* cache, int layer) { return !(cache && cache->holds_all(layer)); }

struct ExpertDeferral {
  int experts = 0;  // d, 0 <= d < n_expert_used; 0: off, the exact path
  int n_layer = 0;

  // Whether `layer` defers: the next layer rings too, since the GPU's wait for its answer is what orders the
  // deferred row (no flag of its own); so the last layer, and one before a layer the cache holds whole, defer
  // nothing.
  bool defers(int layer, const ExpertCache* cache) const {
    return experts > 0 && layer + 1 < n_layer && layer_rings(cache, layer) && layer_rings(cache, layer + 1);
  }
};

}  // namespace strata
