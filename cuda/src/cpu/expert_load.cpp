#include "expert_load.hpp"

#include <cstdio>

#include "worker_team.hpp"

namespace strata::cpu {

void MatrixLoad::start(const FileReader* file, std::int64_t offset, std::int64_t length, std::uint8_t* bounce,
                       BlockType type, std::int64_t n_blocks, const PlaneTargets& dst, int layer, int expert,
                       const char* matrix) {
  file_ = file;
  offset_ = offset;
  length_ = length;
  bounce_ = bounce;
  raw_ = nullptr;
  type_ = type;
  n_blocks_ = n_blocks;
  dst_ = dst;
  std::snprintf(what_, sizeof(what_), "layer %d expert %d %s", layer, expert, matrix);
  state_.store(kReading, std::memory_order_release);
}

void MatrixLoad::run() noexcept {
  try {
    raw_ = file_->read(offset_, length_, bounce_, what_);
    state_.store(kRaw, std::memory_order_release);
  } catch (...) {
    error_ = std::current_exception();
    state_.store(kFailed, std::memory_order_release);
  }
}

bool MatrixLoad::await() noexcept {
  for (;;) {
    int s = state_.load(std::memory_order_acquire);
    if (s == kReady) return true;
    if (s == kFailed) return false;
    if (s == kRaw && state_.compare_exchange_strong(s, kRepacking, std::memory_order_acq_rel)) {
      repack_blocks(type_, raw_, n_blocks_, dst_);
      state_.store(kReady, std::memory_order_release);
      return true;
    }
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
