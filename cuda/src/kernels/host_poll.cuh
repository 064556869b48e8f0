// A device-side wait for a word the host writes into mapped pinned memory: one thread polls it, sleeping between
// polls, bounded in time by the GPU's global timer. The doorbell's wait for an answer (doorbell.cu) and the
// sampler's wait for a token mask published after the launch (sample.cu) both wait this way.
#pragma once

namespace strata::kernels {

constexpr unsigned kPollSleepNs = 200;  // between polls: keeps PCIe traffic low, costs < 1 us of latency

// Nanoseconds of the GPU's global timer: a timeout in time, whatever __nanosleep really sleeps.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Polls `done()` (its loads volatile: the host's word, past the caches) until it holds or timeout_ns nanoseconds
// have passed, then polls it once more; returns its last value. The caller fences (__threadfence_system, an
// acquire) before it reads what the word guards.
template <class Done>
__device__ __forceinline__ bool poll_until(Done done, long long timeout_ns) {
  const unsigned long long start = global_timer_ns();
  while (!done()) {
    if (global_timer_ns() - start >= static_cast<unsigned long long>(timeout_ns)) return done();
    __nanosleep(kPollSleepNs);
  }
  return true;
}

}  // namespace strata::kernels
