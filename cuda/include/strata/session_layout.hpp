// Every byte of one session's sequence state on the GPU, laid out in one arena: the single definition of
// what a session allocates (strata.runtime.plan reads it through the binding before loading; the session
// allocates exactly it). Host-only header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "strata/geometry.hpp"
#include "strata/kv_format.hpp"

namespace strata {

struct Region {
  std::string name;
  int layer = -1;  // -1 for session-wide regions
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct SessionLayout {
  int kv_pages = 0;  // pages per attention layer
  int snapshots = 0;  // slots of the "state snapshots" region
  std::size_t state_bytes = 0;  // one slot: every recurrent-state region, each at its aligned size
  std::vector<Region> regions;
  std::size_t total = 0;

  // Sum of the bytes of every region whose name is `name`.
  std::size_t bytes_of(const std::string& name) const;
};

constexpr int kKvPageTokens = 256;  // tokens per KV page: whole QSA blocks, and the planning granularity
constexpr std::size_t kRegionAlign = 256;

// The bytes a region of `bytes` takes in the arena: regions start at kRegionAlign boundaries.
constexpr std::size_t region_span(std::size_t bytes) {
  return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}
constexpr int kMaxSnapshots = 64;

// The state a sequence cannot cut back to an earlier position, and so is snapshotted whole: GDN recurrent and
// conv state, PLE conv history. KV, indexer keys and the seen ids are indexed by position and need no copy.
bool is_recurrent_state(const std::string& region);

// The layout for `context` tokens and `snapshots` slots of recurrent state; throws InvalidArgument naming an
// impossible geometry, context or slot count.
SessionLayout plan_session(const ModelGeometry& g, int context, KvStorage kv, int snapshots = 0);

}  // namespace strata
