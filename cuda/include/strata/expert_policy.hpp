// Which routed experts the VRAM expert cache holds as routing moves (docs/expert_cache.md, "Replacement"):
// per layer, an expert that misses `admit_after` times within `window` tokens is admitted into the slot
// used least recently, at most `max_copies` experts per token over all layers. The cache copies what
// plan() returns and reports each copy done one token later (complete()); the policy is host-only and
// deterministic, so the same routing gives the same placement: the CPU trace benchmark runs it alone.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct PolicyOptions {
  bool replace = false;  // false: the experts held at the start stay (a static placement)
  int admit_after = 2;   // misses within the window that admit an expert
  int window = 32;       // tokens
  int max_copies = 4;    // experts copied per token, all layers together
};

// One copy the cache is to make: `expert` into `slot` of `layer`, replacing `evicted` (-1: the slot was empty).
struct ExpertMove {
  int layer = 0, slot = 0, expert = 0, evicted = -1;
};

class ReplacementPolicy {
 public:
  // slots[l] slots of layers with n_expert experts each; every slot empty until hold() fills it.
  ReplacementPolicy(const std::vector<int>& slots, int n_expert, const PolicyOptions& options);

  // The layer's slots hold `experts` in order (the rest empty), as the cache's hold() placed them.
  void hold(int layer, const std::vector<int>& experts);

  // One token's routed ids of `layer`: hits refresh their slots, misses count toward admission. Returns the
  // number of ids the layer's slots hold now (the hits). For a layer without slots, returns 0.
  int note(int layer, const std::int32_t* ids, int k);

  // Ends the token: the moves to make now (the evicted experts leave the map at once; the admitted ones enter
  // it when complete() is called for them, which the cache does before the token after next).
  std::vector<ExpertMove> plan();
  void complete(const ExpertMove& move);

  int slot_of(int layer, int expert) const;  // -1: not held (or still being copied)
  int expert_in(int layer, int slot) const;  // -1: empty (or still being copied)
  int slots(int layer) const;
  int layers() const noexcept { return static_cast<int>(layers_.size()); }
  const PolicyOptions& options() const noexcept { return options_; }

 private:
  struct Layer {
    std::vector<int> slot_of;       // [n_expert], -1 when not held
    std::vector<int> expert_in;     // [slots], -1 when empty or filling
    std::vector<bool> filling;      // [slots]: a copy into it is in flight
    std::vector<long> last_use;     // [slots]: the last token that routed to it
    std::vector<long> last_miss;    // [n_expert]
    std::vector<int> misses;        // [n_expert]: misses within the window ending at last_miss
    std::vector<bool> incoming;     // [n_expert]: being copied in
    std::vector<long> queued;       // [n_expert]: the token it last became a candidate in
    std::vector<int> candidates;    // experts that qualified this token, in the order they did
  };
  Layer& at(int layer);
  const Layer& at(int layer) const;

  int n_expert_;
  PolicyOptions options_;
  std::vector<Layer> layers_;
  long token_ = 0;
};

}  // namespace strata
