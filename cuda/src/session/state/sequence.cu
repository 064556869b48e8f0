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
      arena_(device, plan_session(g, options.context, options.kv, options.snapshots + options.verify_rows,
                                  options.kv_streaming)),
      views_(sequence_views(g, t, arena_, options.kv, options.verify_rows)),
      history_(history_bytes(views_.context)),
      ple_(ple),
      steering_(device, g.n_layer, g.n_embd),
      snapshot_position_(options.snapshots, -1),
      ple_saved_(options.snapshots),
      snapshots_(options.snapshots) {
  if (views_.kv_streaming) {  // the arena's reset zeroed the windows; empty is every slot -1
    empty_windows(nullptr);
    STRATA_CUDA_TRY(cudaStreamSynchronize(nullptr));
  }
}

kernels::StateSpan Sequence::span(int first, int count, bool keep_rows) const {
  STRATA_EXPECTS(!keep_rows || count <= verify_rows(), InvalidArgument,
                 "a span keeping its rows' states holds at most the sequence's " + std::to_string(verify_rows()) +
                     " row states, got " + std::to_string(count) + " rows");
  kernels::StateSpan span;
  span.state = static_cast<char*>(arena_.data());
  span.rows = keep_rows ? arena_.slot_start(arena_.layout().snapshots - verify_rows()) : nullptr;
  span.first = first;
  span.count = count;
  return span;
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

void Sequence::begin_verify(const int* tokens, int n) {
  STRATA_EXPECTS(n >= 1 && n <= verify_rows(), InvalidArgument,
                 "a verification step takes 1.." + std::to_string(verify_rows()) + " tokens (the session keeps " +
                     "that many rows of state), got " + std::to_string(n));
  verify_start_ = position_;
  if (ple_) ple_before_verify_ = ple_->previous();
  verified_.assign(tokens, tokens + n);  // after begin_step, which closes any earlier window
}

void Sequence::truncate(int position, cudaStream_t s) {
  const int end = verify_start_ + static_cast<int>(verified_.size());
  STRATA_EXPECTS(!broken_ && !verified_.empty() && position > verify_start_ && position <= end, InvalidArgument,
                 verified_.empty() ? std::string("truncate() follows a verification step, before anything else")
                                   : "truncate() after the verification of positions " +
                                         std::to_string(verify_start_) + ".." + std::to_string(end - 1) +
                                         " keeps " + std::to_string(verify_start_ + 1) + ".." + std::to_string(end) +
                                         " tokens, got " + std::to_string(position));
  if (position == end) return;
  const int kept = position - verify_start_;
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  arena_.restore(snapshots_ + kept - 1);
  // The windows may hold blocks with the cut tokens' KV: fetched again from the host copy, where the next tokens'
  // rows are written first.
  empty_windows(s);
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  if (ple_) {
    std::vector<std::int64_t> ids = ple_before_verify_;  // the n-gram state shifts in each token it hashes
    ids.insert(ids.end(), verified_.begin(), verified_.begin() + kept);
    ple_->set_previous({ids.end() - ple_before_verify_.size(), ids.end()});
  }
  position_ = position;
  verified_.resize(kept);  // a later truncate may cut further back
}

void Sequence::reset(cudaStream_t s) {
  (void)cudaStreamSynchronize(s);
  arena_.reset();
  empty_windows(s);
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  position_ = 0;
  broken_ = false;
  verified_.clear();
  snapshot_position_.assign(snapshot_position_.size(), -1);
  if (ple_) ple_->reset();
}

void Sequence::snapshot(int slot, cudaStream_t s) {
  STRATA_EXPECTS(!broken_, Error, "an earlier step failed midway; reset() the session before a snapshot");
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  arena_.snapshot(slot);  // checks the slot
  snapshot_position_[slot] = position_;
  verified_.clear();
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
  verified_.clear();
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
