// Pinned worker threads that spin while work keeps coming and park on a futex when idle.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace strata::cpu {

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

  // Runs job(context, w) on every worker w and returns once all have returned. One caller at a time; the
  // job must not throw. Allocates nothing.
  void run(Job job, void* context);

  // Called by every worker from inside a job: returns once all workers have reached it.
  void barrier();

  // Workers currently parked on the futex (for tests of the idle behaviour).
  int parked() const { return parked_.load(std::memory_order_acquire); }

 private:
  void worker_main(int index, std::vector<int> cpus);

  std::vector<std::thread> threads_;
  int spin_us_;
  Job job_ = nullptr;
  void* context_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};  // bumped per job; the futex word
  alignas(64) std::atomic<int> parked_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> barrier_arrived_{0};
  alignas(64) std::atomic<uint32_t> barrier_epoch_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> started_{0};
};

}  // namespace strata::cpu
