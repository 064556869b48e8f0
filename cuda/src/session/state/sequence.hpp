// One sequence's state (docs/architecture.md, "Sequences and the runner"): its arena (KV, recurrent and conv
// state, indexer keys, the residual streams), the device views programs read that state through, the penalty's
// history of every token fed, its position, its state snapshots with the PLE n-gram state each keeps, and the
// control vectors its layers add (steering.hpp). What
// steps a sequence (programs, schedule, doorbell, stream, scratch) is the Runner's (runner.hpp); a sequence holds
// nothing of it, so one runner's programs can later step several sequences, or k rows of one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "../../kernels/state_spans.cuh"
#include "../../runtime/device_buffer.hpp"
#include "sequence_views.hpp"
#include "steering.hpp"
#include "strata/geometry.hpp"
#include "strata/ple_gather.hpp"
#include "strata/session_arena.hpp"

namespace strata {

struct SequenceOptions {
  int context = 0;            // tokens the sequence may hold (its KV rounds up to whole pages)
  KvStorage kv = KvStorage::Int8;
  int snapshots = 0;          // slots of recurrent state for snapshot() / restore()
  bool kv_streaming = false;  // attention KV in page-locked host memory, a VRAM window of it
  int verify_rows = 0;        // the most tokens a verification step takes (their row states: more snapshot slots)
};

class Sequence {
 public:
  // Plans and allocates the arena on `device` (OutOfMemory naming the need) and the history, both empty. `ple`
  // (may be null: the caller passes each token's PLE rows) is the gather whose n-gram state is this sequence's
  // and outlives it.
  Sequence(int device, const ModelGeometry& g, const ModelTensors& t, const SequenceOptions& options,
           PleGather* ple);
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Device bytes of the history of a sequence of `context` tokens (whole pages): what the memory plan counts.
  static std::size_t history_bytes(int context);

  const SequenceViews& views() const noexcept { return views_; }
  const SessionLayout& layout() const noexcept { return arena_.layout(); }
  // This sequence as a span of a step of several rows (kernels/state_spans.cuh): `count` rows from row `first`
  // of the step, its arena, and with `keep_rows` its first row-state slot (InvalidArgument where it keeps none).
  kernels::StateSpan span(int first, int count, bool keep_rows) const;
  int* history() const noexcept { return history_.as<int>(); }
  PleGather* ple() const noexcept { return ple_; }
  // Its control vectors, which a reset, snapshot or restore leaves as they are (they are the session's setting).
  const Steering& steering() const noexcept { return steering_; }
  Steering& steering() noexcept { return steering_; }
  int position() const noexcept { return position_; }
  int context() const noexcept { return context_; }

  // Throws unless `n` more tokens fit (InvalidArgument) and the last step completed (Error).
  void check_room(int n) const;
  // A step's state changes begin: until end_step, a failure leaves the sequence broken (reset() mends it).
  void begin_step() noexcept {
    broken_ = true;
    verified_.clear();
  }
  void end_step(int n) noexcept {
    broken_ = false;
    position_ += n;
  }
  bool broken() const noexcept { return broken_; }

  // An empty sequence: the arena's state zeroed, every streaming window emptied, the n-gram state cleared, the
  // snapshots forgotten. `s`: the stream that writes the state, drained first.
  void reset(cudaStream_t s);
  // The sequence so far kept in slot `slot`, and brought back (what was fed after it is forgotten). `s` drained.
  void snapshot(int slot, cudaStream_t s);
  void restore(int slot, cudaStream_t s);

  // A verification step (docs/speculative.md): begin_verify(tokens, n) before `tokens` run as one chunk that
  // writes each row's state (views().rows); until the next step, feed, snapshot, restore or reset,
  // truncate(position, s) then brings the sequence back to exactly its state after `position` tokens, anywhere
  // from the first verified token to the last. InvalidArgument outside that window or with more tokens than
  // the sequence keeps rows for.
  void begin_verify(const int* tokens, int n);
  void truncate(int position, cudaStream_t s);
  int verify_rows() const noexcept { return views_.rows.count; }

  // KV streaming: the bytes the windows fetched from the host copy since the last reset, read from the device
  // (synchronous; 0 without streaming).
  unsigned long long kv_stream_bytes() const;

 private:
  void empty_windows(cudaStream_t s) const;

  int context_;
  SessionArena arena_;
  SequenceViews views_;
  DeviceBuffer history_;
  PleGather* ple_;
  Steering steering_;
  int position_ = 0;
  bool broken_ = false;
  std::vector<int> snapshot_position_;                   // per slot; -1: empty
  std::vector<std::vector<std::int64_t>> ple_saved_;     // per slot: the n-gram state it keeps
  int snapshots_;                                        // the sequence's own slots; the row states' follow
  std::vector<int> verified_;                            // the open verification window's tokens
  int verify_start_ = 0;                                 // ... and the position before them
  std::vector<std::int64_t> ple_before_verify_;          // ... and the n-gram state before them
};

}  // namespace strata
