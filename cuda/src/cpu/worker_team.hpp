// Pinned worker threads that spin while work keeps coming and park on a futex when idle. The thread that hands
// them a job takes part in it where it runs apart from them (pinned to CPUs no worker is pinned to): it would
// otherwise only spin until they finish, and on a worker's CPU it would stall the job instead.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace strata::cpu {

// One step of a spin-wait on the team's counters (the workers' wait for work, a job's wait on another item): a
// pause on x86, which frees the core's pipeline for its sibling and eases the exit from the loop.
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class WorkerTeam {
 public:
  using Job = void (*)(void* context, int worker);

  // One worker per entry of `worker_cpus` (each a set of logical CPUs it is pinned to; empty = not pinned).
  // A worker spins for `spin_us` microseconds after its last job before parking.
  WorkerTeam(const std::vector<std::vector<int>>& worker_cpus, int spin_us);
  ~WorkerTeam();
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // The most participants a job can have: every worker and the caller. Per-participant scratch is sized so.
  int max_participants() const { return size() + 1; }

  // The participants a job handed over by the calling thread has: the workers, and the caller where it joins.
  int participants() const { return size() + (caller_apart() ? 1 : 0); }

  // Runs job(context, p) on every worker p < size() and, where the calling thread runs apart from the workers,
  // on the caller as participant size(); returns once all have returned. One caller at a time; the job must not
  // throw. Allocates nothing (the caller's placement is read once per thread).
  void run(Job job, void* context);

  // Called by every participant from inside a job: returns once all of them have reached it.
  void barrier();

  // Workers currently parked on the futex (for tests of the idle behaviour).
  int parked() const { return parked_.load(std::memory_order_acquire); }

 private:
  void worker_main(int index, std::vector<int> cpus);
  bool caller_apart() const;

  const std::uint64_t id_;            // tells the teams apart in the per-thread record of caller_apart
  std::vector<int> worker_cpu_list_;  // every CPU a worker is pinned to, ascending; empty if one floats

  std::vector<std::thread> threads_;
  int spin_us_;
  Job job_ = nullptr;
  void* context_ = nullptr;
  int participants_ = 0;  // of the job in flight: the workers, and the caller where it joins
  alignas(64) std::atomic<uint32_t> generation_{0};  // bumped per job; the futex word
  alignas(64) std::atomic<int> parked_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> barrier_arrived_{0};
  alignas(64) std::atomic<uint32_t> barrier_epoch_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> started_{0};
};

}  // namespace strata::cpu
