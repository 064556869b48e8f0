// One session's sequence state: a single VRAM allocation laid out by plan_session (and, under KV streaming, one
// page-locked host allocation mapped into the device), with the regions found by name and layer, and reset() to
// an empty sequence. Host-only header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "strata/session_layout.hpp"

namespace strata {

class PinnedMapped;

class SessionArena {
 public:
  // Allocates layout.total bytes on `device` (OutOfMemory naming the need and what is free) and layout.host_total
  // bytes of page-locked host memory (OutOfMemory if the host cannot lock them), then reset().
  SessionArena(int device, SessionLayout layout);
  ~SessionArena();
  SessionArena(const SessionArena&) = delete;
  SessionArena& operator=(const SessionArena&) = delete;

  // Device address of region `name` of `layer` (-1 for session-wide), a host region's as the device maps it;
  // InvalidArgument naming a missing one.
  void* region(const std::string& name, int layer = -1) const;

  // An empty sequence: every device state region zeroed (a streaming window's too: the session empties each with
  // kv_window_reset), every KV page table the identity. The host regions (streamed KV, raw indexer keys) are
  // zeroed once, at allocation: they are indexed by position and every row is written before it is read.
  // Synchronous.
  void reset();

  // The recurrent state (is_recurrent_state) copied into / back from snapshot slot `slot`; KV and indexer keys
  // are indexed by position and stay. InvalidArgument for a slot the layout lacks. Synchronous.
  void snapshot(int slot);
  void restore(int slot);
  // Device address of recurrent-state region `name` of `layer` as snapshot slot `slot` holds it (a slot mirrors
  // the recurrent regions, session_layout.hpp): where a verification step writes a row's state. InvalidArgument
  // for a slot the layout lacks or a region that is not recurrent state.
  void* slot_region(int slot, const std::string& name, int layer = -1) const;
  // Device address of snapshot slot `slot`; InvalidArgument for a slot the layout lacks.
  char* slot_start(int slot) const;

  // Device address of the whole allocation (layout().total bytes).
  void* data() const noexcept { return base_; }
  const SessionLayout& layout() const noexcept { return layout_; }
  int device() const noexcept { return device_; }

 private:
  void copy_state(int slot, bool save);

  int device_;
  SessionLayout layout_;
  void* base_ = nullptr;
  std::unique_ptr<PinnedMapped> host_;
};

}  // namespace strata
