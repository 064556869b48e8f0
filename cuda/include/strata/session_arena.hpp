// One session's sequence state in VRAM: a single allocation laid out by plan_session, with the regions
// found by name and layer, and reset() to an empty sequence. Host-only header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "strata/session_layout.hpp"

namespace strata {

class SessionArena {
 public:
  // Allocates layout.total bytes on `device` (OutOfMemory naming the need and what is free), then reset().
  SessionArena(int device, SessionLayout layout);
  ~SessionArena();
  SessionArena(const SessionArena&) = delete;
  SessionArena& operator=(const SessionArena&) = delete;

  // Device address of region `name` of `layer` (-1 for session-wide); InvalidArgument naming a missing one.
  void* region(const std::string& name, int layer = -1) const;

  // An empty sequence: every state region zeroed, every KV page table the identity. Synchronous.
  void reset();

  // The recurrent state (is_recurrent_state) copied into / back from snapshot slot `slot`; KV and indexer keys
  // are indexed by position and stay. InvalidArgument for a slot the layout lacks. Synchronous.
  void snapshot(int slot);
  void restore(int slot);

  // Device address of the whole allocation (layout().total bytes).
  void* data() const noexcept { return base_; }
  const SessionLayout& layout() const noexcept { return layout_; }
  int device() const noexcept { return device_; }

 private:
  void copy_state(int slot, bool save);

  int device_;
  SessionLayout layout_;
  void* base_ = nullptr;
};

}  // namespace strata
