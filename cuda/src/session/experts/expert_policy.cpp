#include "strata/expert_policy.hpp"

#include <string>

#include "strata/error.hpp"

namespace strata {
namespace {

std::string str(long long v) { return std::to_string(v); }

}  // namespace

ReplacementPolicy::ReplacementPolicy(const std::vector<int>& slots, int n_expert, const PolicyOptions& options)
    : n_expert_(n_expert), options_(options), layers_(slots.size()) {
  STRATA_EXPECTS(n_expert > 0, InvalidArgument, "expert policy: n_expert must be > 0, got " + str(n_expert));
  STRATA_EXPECTS(options.admit_after >= 1 && options.window >= 1 && options.max_copies >= 0, InvalidArgument,
                 "expert policy: admit_after and window must be >= 1 and max_copies >= 0, got " +
                     str(options.admit_after) + ", " + str(options.window) + ", " + str(options.max_copies));
  for (std::size_t l = 0; l < slots.size(); ++l) {
    STRATA_EXPECTS(slots[l] >= 0 && slots[l] <= n_expert, InvalidArgument,
                   "expert policy: layer " + str(l) + " slots must be in 0.." + str(n_expert) + ", got " +
                       str(slots[l]));
    Layer& layer = layers_[l];
    layer.slot_of.assign(n_expert, -1);
    layer.expert_in.assign(slots[l], -1);
    layer.filling.assign(slots[l], false);
    layer.last_use.assign(slots[l], -1);
    layer.last_miss.assign(n_expert, -(1L << 40));
    layer.misses.assign(n_expert, 0);
    layer.incoming.assign(n_expert, false);
    layer.queued.assign(n_expert, -1);
  }
}

ReplacementPolicy::Layer& ReplacementPolicy::at(int layer) {
  STRATA_EXPECTS(layer >= 0 && layer < layers(), InvalidArgument,
                 "expert policy: layer " + str(layer) + " is outside 0.." + str(layers() - 1));
  return layers_[layer];
}

const ReplacementPolicy::Layer& ReplacementPolicy::at(int layer) const {
  return const_cast<ReplacementPolicy*>(this)->at(layer);
}

void ReplacementPolicy::hold(int layer, const std::vector<int>& experts) {
  Layer& l = at(layer);
  STRATA_EXPECTS(experts.size() <= l.expert_in.size(), InvalidArgument,
                 "expert policy: layer " + str(layer) + " has " + str(l.expert_in.size()) + " slots, asked to hold " +
                     str(experts.size()));
  l.slot_of.assign(n_expert_, -1);
  l.expert_in.assign(l.expert_in.size(), -1);
  l.filling.assign(l.filling.size(), false);
  l.incoming.assign(n_expert_, false);
  for (std::size_t s = 0; s < experts.size(); ++s) {
    const int e = experts[s];
    STRATA_EXPECTS(e >= 0 && e < n_expert_ && l.slot_of[e] < 0, InvalidArgument,
                   "expert policy: layer " + str(layer) + " expert " + str(e) + " is outside 0.." + str(n_expert_ - 1) +
                       " or given twice");
    l.slot_of[e] = static_cast<int>(s);
    l.expert_in[s] = e;
  }
}

int ReplacementPolicy::note(int layer, const std::int32_t* ids, int k) {
  Layer& l = at(layer);
  if (l.expert_in.empty()) return 0;
  int hits = 0;
  for (int j = 0; j < k; ++j) {
    const int e = ids[j];
    STRATA_EXPECTS(e >= 0 && e < n_expert_, InvalidArgument,
                   "expert policy: layer " + str(layer) + " routed id " + str(e) + " is outside 0.." + str(n_expert_ - 1));
    if (const int s = l.slot_of[e]; s >= 0) {
      l.last_use[s] = token_;
      ++hits;
      continue;
    }
    if (!options_.replace || l.incoming[e]) continue;
    // A miss: count it within the window that ends here; once it has missed often enough the expert is a
    // candidate (again at every later miss, while the copy budget keeps it out).
    l.misses[e] = token_ - l.last_miss[e] <= options_.window ? l.misses[e] + 1 : 1;
    l.last_miss[e] = token_;
    if (l.misses[e] >= options_.admit_after && l.queued[e] != token_) {
      l.queued[e] = token_;
      l.candidates.push_back(e);
    }
  }
  return hits;
}

std::vector<ExpertMove> ReplacementPolicy::plan() {
  std::vector<ExpertMove> moves;
  const int n = layers();
  // The copy budget goes round the layers, starting one layer further each token, so no layer starves.
  for (int i = 0; i < n && n > 0; ++i) {
    const int layer = static_cast<int>((token_ + i) % n);
    Layer& l = layers_[layer];
    for (const int e : l.candidates) {
      if (static_cast<int>(moves.size()) >= options_.max_copies) break;
      // The least recently used slot not in flight and not used by this token; empty slots first.
      int victim = -1;
      for (int s = 0; s < static_cast<int>(l.expert_in.size()); ++s) {
        if (l.filling[s] || l.last_use[s] == token_) continue;
        if (victim < 0 || l.last_use[s] < l.last_use[victim]) victim = s;
      }
      if (victim < 0) break;
      const int evicted = l.expert_in[victim];
      if (evicted >= 0) l.slot_of[evicted] = -1;
      l.expert_in[victim] = -1;
      l.filling[victim] = true;
      l.incoming[e] = true;
      l.misses[e] = 0;
      moves.push_back({layer, victim, e, evicted});
    }
    l.candidates.clear();
  }
  ++token_;
  return moves;
}

void ReplacementPolicy::complete(const ExpertMove& move) {
  Layer& l = at(move.layer);
  STRATA_EXPECTS(move.slot >= 0 && move.slot < static_cast<int>(l.filling.size()) && l.filling[move.slot],
                 InvalidArgument,
                 "expert policy: layer " + str(move.layer) + " slot " + str(move.slot) + " has no copy in flight");
  l.filling[move.slot] = false;
  l.incoming[move.expert] = false;
  l.expert_in[move.slot] = move.expert;
  l.slot_of[move.expert] = move.slot;
  l.last_use[move.slot] = token_;
}

int ReplacementPolicy::slot_of(int layer, int expert) const {
  const Layer& l = at(layer);
  return expert >= 0 && expert < n_expert_ ? l.slot_of[expert] : -1;
}

int ReplacementPolicy::expert_in(int layer, int slot) const {
  const Layer& l = at(layer);
  return slot >= 0 && slot < static_cast<int>(l.expert_in.size()) ? l.expert_in[slot] : -1;
}

int ReplacementPolicy::slots(int layer) const { return static_cast<int>(at(layer).expert_in.size()); }

}  // namespace strata
