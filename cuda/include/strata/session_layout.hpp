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

// Where a region lives: the session's VRAM arena, or (KV streaming) its page-locked host arena, mapped into the
// device's address space so that kernels read and write it over PCIe.
enum class Place : int { Device = 0, Host = 1 };

struct Region {
  std::string name;
  int layer = -1;  // -1 for session-wide regions
  std::size_t offset = 0;  // within its place's arena
  std::size_t bytes = 0;
  Place place = Place::Device;
};

struct SessionLayout {
  int kv_pages = 0;  // pages per attention layer
  int snapshots = 0;  // slots of the "state snapshots" region
  bool kv_streaming = false;
  int window_slots = 0;  // KV streaming: QSA blocks each attention layer's VRAM window holds
  std::size_t state_bytes = 0;  // one slot: every recurrent-state region, each at its aligned size
  std::vector<Region> regions;
  std::size_t total = 0;       // bytes of the VRAM arena
  std::size_t host_total = 0;  // bytes of the host arena (KV streaming), 0 without

  // Sum of the bytes of every region whose name is `name`.
  std::size_t bytes_of(const std::string& name) const;
  // Where recurrent-state region `name` of `layer` (-1 for session-wide) starts within a snapshot slot, which
  // mirrors the recurrent regions' spans in order; InvalidArgument naming a region a slot does not hold.
  std::size_t slot_offset(const std::string& name, int layer = -1) const;
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

// Bytes of one attention layer's keys (or, with `values`, its values) in `kv` for `context` tokens (whole pages):
// a "kv keys" / "kv values" region, and under KV streaming the prompt path's buffer of one layer.
std::size_t kv_half_region_bytes(const ModelGeometry& g, int context, KvStorage kv, bool values);

// Window slots per attention layer under KV streaming: every block one token's selection names, plus the
// block its own row goes into and the block the next token's goes into.
constexpr int kv_window_slots(int keep_blocks) { return keep_blocks + 2; }

// The layout for `context` tokens and `snapshots` slots of recurrent state; with `kv_streaming`, each attention
// layer's KV and raw indexer keys live in the host arena and a VRAM window holds the blocks a token reads
// (docs/session.md, "KV streaming"). Throws InvalidArgument naming an impossible geometry, context or slot count,
// or an attention layer that streaming cannot serve (one without a QSA indexer reads every cell).
SessionLayout plan_session(const ModelGeometry& g, int context, KvStorage kv, int snapshots = 0,
                           bool kv_streaming = false);

}  // namespace strata
