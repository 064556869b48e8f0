// Every byte of one session's sequence state on the GPU, laid out in one arena: the single definition of
// what a session allocates (strata.runtime.plan reads it through the binding before loading; the session
// allocates exactly it). Host-only header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "strata/geometry.hpp"

namespace strata {

enum class KvStorage : int { Bf16 = 0, Int8 = 1 };

struct Region {
  std::string name;
  int layer = -1;  // -1 for session-wide regions
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct SessionLayout {
  int kv_pages = 0;  // pages per attention layer
  std::vector<Region> regions;
  std::size_t total = 0;

  // Sum of the bytes of every region whose name is `name`.
  std::size_t bytes_of(const std::string& name) const;
};

constexpr int kKvPageTokens = 256;  // tokens per KV page: whole QSA blocks, and the planning granularity

// The layout for `context` tokens; throws InvalidArgument naming an impossible geometry or context.
SessionLayout plan_session(const ModelGeometry& g, int context, KvStorage kv);

}  // namespace strata
