#include "expert_load.hpp"

#include <algorithm>
#include <cstdio>

#include "worker_team.hpp"

namespace strata::cpu {

int MatrixLoad::start(const FileReader* file, std::int64_t offset, std::int64_t length, std::uint8_t* bounce,
                      BlockType type, std::int64_t n_blocks, const PlaneTargets& dst, int layer, int expert,
                      const char* matrix) {
  constexpr std::int64_t kAlign = FileReader::kAlign;
  file_ = file;
  offset_ = offset;
  length_ = length;
  bounce_ = bounce;
  type_ = type;
  n_blocks_ = n_blocks;
  dst_ = dst;
  std::snprintf(what_, sizeof(what_), "layer %d expert %d %s", layer, expert, matrix);
  // The aligned span around the matrix, cut at aligned boundaries: piece i reads [span_start_ + i * piece_bytes_,
  // + piece_bytes_) of it (less what lies outside the matrix) into the same place of the bounce, so the pieces
  // together leave the bounce as one read of the span would.
  span_start_ = offset / kAlign * kAlign;
  const std::int64_t span = (offset + length + kAlign - 1) / kAlign * kAlign - span_start_;
  const std::int64_t share = ((span + kMaxPieces - 1) / kMaxPieces + kAlign - 1) / kAlign * kAlign;
  piece_bytes_ = std::max(kPieceBytes, share);
  const int pieces = static_cast<int>(std::max<std::int64_t>(1, (span + piece_bytes_ - 1) / piece_bytes_));
  for (int i = 0; i < pieces; ++i) pieces_[i] = Piece(this, i);
  raw_ = bounce + (offset - span_start_);
  error_ = nullptr;
  failed_.store(false, std::memory_order_relaxed);
  run_blocks_ = std::max<std::int64_t>(1, kRepackBytes / block_layout(type, what_).bytes);
  next_block_.store(0, std::memory_order_relaxed);
  blocks_done_.store(0, std::memory_order_relaxed);
  pieces_left_.store(pieces, std::memory_order_relaxed);
  state_.store(kReading, std::memory_order_release);
  return pieces;
}

void MatrixLoad::read_piece(int i) noexcept {
  const std::int64_t first = span_start_ + i * piece_bytes_;
  const std::int64_t begin = std::max(offset_, first), end = std::min(offset_ + length_, first + piece_bytes_);
  try {
    file_->read(begin, end - begin, bounce_ + (first - span_start_), what_);
  } catch (...) {
    if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
  }
  // The last piece back publishes the load: its acq_rel count orders every other piece's bytes and error before it.
  if (pieces_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    state_.store(failed_.load(std::memory_order_relaxed) ? kFailed : kRaw, std::memory_order_release);
  }
}

void MatrixLoad::repack_share() noexcept {
  if (n_blocks_ == 0) state_.store(kReady, std::memory_order_release);  // nothing to repack: no run would say so
  for (;;) {
    const std::int64_t first = next_block_.fetch_add(run_blocks_, std::memory_order_relaxed);
    if (first >= n_blocks_) return;
    const std::int64_t count = std::min(run_blocks_, n_blocks_ - first);
    repack_blocks(type_, raw_, first, count, dst_);
    // Release: this run's planes before the count; the run that completes the count publishes the whole matrix.
    if (blocks_done_.fetch_add(count, std::memory_order_acq_rel) + count == n_blocks_) {
      state_.store(kReady, std::memory_order_release);
    }
  }
}

bool MatrixLoad::await() noexcept {
  for (;;) {
    int s = state_.load(std::memory_order_acquire);
    if (s == kReady) return true;
    if (s == kFailed) return false;
    // The bytes are in: the first to see it marks the repack begun (settle waits for kRepacking to end), then
    // every waiter takes runs until none is left, and waits for the others' last runs.
    if (s == kRaw) state_.compare_exchange_strong(s, kRepacking, std::memory_order_acq_rel);
    if (state_.load(std::memory_order_acquire) == kRepacking) repack_share();
    spin_pause();
  }
}

bool MatrixLoad::settle() noexcept {
  for (;;) {
    const int s = state_.load(std::memory_order_acquire);
    if (s == kFailed) return false;
    if (s != kReading && s != kRepacking) return true;
    spin_pause();
  }
}

}  // namespace strata::cpu
