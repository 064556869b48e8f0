#include "doorbell_host.hpp"

#include <immintrin.h>

#include <atomic>
#include <string>

#include "strata/error.hpp"

namespace strata {
namespace {

std::size_t align64(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

// The two sides communicate through plain loads and stores on mapped memory: the GPU's
// __threadfence_system orders its side, these fences and volatile accesses order ours.
int load_word(const int* word) noexcept { return *static_cast<const volatile int*>(word); }
void store_word(int* word, int value) noexcept { *static_cast<volatile int*>(word) = value; }


int checked_width(int value, const char* what) {
  STRATA_EXPECTS(value > 0, InvalidArgument, std::string("doorbell needs ") + what + " > 0, got " + std::to_string(value));
  return value;
}

}  // namespace

DoorbellHost::DoorbellHost(int n, int k, int first_ring_base, int rows)
    : n_(checked_width(n, "n")),
      k_(checked_width(k, "k")),
      rows_(checked_width(rows, "rows")),
      weights_offset_(kIds + align64(sizeof(std::int32_t) * k_ * rows_)),
      x_offset_(weights_offset_ + align64(sizeof(float) * k_ * rows_)),
      answer_offset_(x_offset_ + align64(sizeof(float) * n_ * rows_)),
      deferred_offset_(answer_offset_ + align64(sizeof(float) * n_ * rows_)),
      memory_(deferred_offset_ + align64(2 * sizeof(float) * n_)) {
  // The last ring rung and answered is the one before the first token's: serial numbers compare by their
  // difference, so a seq or flag left at 0 would already "reach" the rings of the 2^31 below 0.
  store_word(memory_.host<int>(kSeq), first_ring_base);
  store_word(memory_.host<int>(kFlag), first_ring_base);
}

kernels::Doorbell DoorbellHost::device_view() const noexcept {
  kernels::Doorbell view;
  view.x = memory_.device<float>(x_offset_);
  view.ids = memory_.device<int>(kIds);
  view.weights = memory_.device<float>(weights_offset_);
  view.seq = memory_.device<int>(kSeq);
  view.flag = memory_.device<const int>(kFlag);
  view.answer = memory_.device<const float>(answer_offset_);
  view.n = n_;
  view.k = k_;
  view.rows = rows_;
  view.deferred = memory_.device<const float>(deferred_offset_);
  return view;
}

void DoorbellHost::begin_token(int ring_base) noexcept {
  store_word(memory_.host<int>(kRingBase), ring_base);
  store_word(memory_.host<int>(kStatus), 0);
  std::atomic_thread_fence(std::memory_order_release);
}

bool DoorbellHost::wait_for_ring(int ring, std::chrono::nanoseconds timeout) const noexcept {
  const int* seq = memory_.host<const int>(kSeq);
  if (kernels::ring_reached(load_word(seq), ring)) {
    std::atomic_thread_fence(std::memory_order_acquire);
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (unsigned spins = 1;; ++spins) {
    _mm_pause();
    if (kernels::ring_reached(load_word(seq), ring)) break;
    // Reading the clock costs ~20 ns: check it only every 1024 polls.
    if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // x, ids, weights are read after seq was seen
  return true;
}

int DoorbellHost::last_ring() const noexcept { return load_word(memory_.host<const int>(kSeq)); }

void DoorbellHost::answer_ready(int ring) noexcept {
  std::atomic_thread_fence(std::memory_order_release);
  store_word(memory_.host<int>(kFlag), ring);
}

int DoorbellHost::timed_out_offset() const noexcept { return load_word(memory_.host<const int>(kStatus)); }

void DoorbellHost::check_answers(int ring_base, double answer_timeout_seconds) const {
  const int offset = timed_out_offset();
  if (offset == 0) return;
  throw Error("layer " + std::to_string(offset - 1) + ": the host's answer to ring " +
              std::to_string(kernels::ring_at(ring_base, offset)) + " never arrived; the GPU's wait gave up after " +
              std::to_string(answer_timeout_seconds) + " s");
}

std::chrono::nanoseconds host_ring_timeout(double answer_timeout_seconds) {
  constexpr double kHostWaitFactor = 3.0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(kHostWaitFactor * answer_timeout_seconds));
}

}  // namespace strata
