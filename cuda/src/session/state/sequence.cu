#include "sequence.hpp"

#include <string>

#include "../../kernels/kv_window.cuh"
#include "strata/error.hpp"
#include "strata/session_layout.hpp"

namespace strata {

std::size_t Sequence::history_bytes(int context) { return sizeof(int) * static_cast<std::size_t>(context); }

Sequence::Sequence(int device, const ModelGeometry& g, const ModelTensors& t, const SequenceOptions& options,
                   PleGather* ple)
    : context_(options.context),
      arena_(device, plan_session(g, options.context, options.kv, options.snapshots, options.kv_streaming)),
      views_(sequence_views(g, t, arena_, options.kv)),
      history_(history_bytes(views_.context)),
      ple_(ple),
      snapshot_position_(options.snapshots, -1),
      ple_saved_(options.snapshots) {
  if (views_.kv_streaming) {  // the arena's reset zeroed the windows; empty is every slot -1
    empty_windows(nullptr);
    STRATA_CUDA_TRY(cudaStreamSynchronize(nullptr));
  }
}

void Sequence::check_room(int n) const {
  STRATA_EXPECTS(!broken_, Error, "an earlier step failed midway; reset() the session before the next step");
  STRATA_EXPECTS(n >= 1 && position_ + n <= context_, InvalidArgument,
                 "the sequence is full: " + std::to_string(position_) + " of " + std::to_string(context_) +
                     " tokens of context are used and " + std::to_string(n) + " more were fed; reset()");
}

void Sequence::empty_windows(cudaStream_t s) const {
  for (const kernels::KvWindow& w : views_.window)
    if (w.slots > 0) STRATA_CUDA_TRY(kernels::kv_window_reset(w, s));
}

void Sequence::reset(cudaStream_t s) {
  (void)cudaStreamSynchronize(s);
  arena_.reset();
  empty_windows(s);
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  position_ = 0;
  broken_ = false;
  snapshot_position_.assign(snapshot_position_.size(), -1);
  if (ple_) ple_->reset();
}

void Sequence::snapshot(int slot, cudaStream_t s) {
  STRATA_EXPECTS(!broken_, Error, "an earlier step failed midway; reset() the session before a snapshot");
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  arena_.snapshot(slot);  // checks the slot
  snapshot_position_[slot] = position_;
  if (ple_) ple_saved_[slot] = ple_->previous();
}

void Sequence::restore(int slot, cudaStream_t s) {
  const int slots = static_cast<int>(snapshot_position_.size());
  STRATA_EXPECTS(slot >= 0 && slot < slots && snapshot_position_[slot] >= 0, InvalidArgument,
                 "state snapshot slot " + std::to_string(slot) + " holds no snapshot (the session has " +
                     std::to_string(slots) + " slots)");
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  arena_.restore(slot);
  position_ = snapshot_position_[slot];
  if (ple_) ple_->set_previous(ple_saved_[slot]);
  broken_ = false;  // every state a later token reads is the snapshot's or indexed below its position
}

unsigned long long Sequence::kv_stream_bytes() const {
  unsigned long long total = 0;
  for (const kernels::KvWindow& w : views_.window) {
    if (w.slots == 0) continue;
    unsigned long long fetched = 0;
    STRATA_CUDA_TRY(cudaMemcpy(&fetched, w.fetched_bytes, sizeof(fetched), cudaMemcpyDeviceToHost));
    total += fetched;
  }
  return total;
}

}  // namespace strata
