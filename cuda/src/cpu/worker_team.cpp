#include "worker_team.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "strata/cpu_topology.hpp"
#include "strata/error.hpp"

namespace strata::cpu {
namespace {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

std::atomic<std::uint64_t> next_team_id{1};

}  // namespace

WorkerTeam::WorkerTeam(const std::vector<std::vector<int>>& worker_cpus, int spin_us)
    : id_(next_team_id.fetch_add(1, std::memory_order_relaxed)), spin_us_(spin_us) {
  STRATA_EXPECTS(!worker_cpus.empty(), InvalidArgument, "worker team: at least one worker is needed, found 0");
  STRATA_EXPECTS(spin_us >= 0, InvalidArgument, "worker team: spin_us must be >= 0, found " + std::to_string(spin_us));
  const bool every_worker_pinned =
      std::none_of(worker_cpus.begin(), worker_cpus.end(), [](const std::vector<int>& c) { return c.empty(); });
  if (every_worker_pinned) {
    for (const auto& cpus : worker_cpus) worker_cpu_list_.insert(worker_cpu_list_.end(), cpus.begin(), cpus.end());
    std::sort(worker_cpu_list_.begin(), worker_cpu_list_.end());
  }
  threads_.reserve(worker_cpus.size());
  for (size_t i = 0; i < worker_cpus.size(); ++i)
    threads_.emplace_back(&WorkerTeam::worker_main, this, static_cast<int>(i), worker_cpus[i]);
  // Wait until every worker has pinned itself, so the first job's timing does not include thread start.
  while (started_.load(std::memory_order_acquire) < size()) std::this_thread::yield();
}

WorkerTeam::~WorkerTeam() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&generation_);
  for (auto& t : threads_) t.join();
}

// A caller whose CPUs a worker also runs on (or that floats) would share a core with a worker that spins
// waiting on the caller's items: it only waits. Read once per thread and team: the pool pins its caller before
// the team starts, and a thread's placement does not change while it drives a team.
bool WorkerTeam::caller_apart() const {
  thread_local std::uint64_t checked_team = 0;
  thread_local bool apart = false;
  if (checked_team != id_) {
    const std::vector<int> mine = current_thread_cpus();  // ascending
    apart = !worker_cpu_list_.empty() && !mine.empty() &&
            std::none_of(mine.begin(), mine.end(), [&](int cpu) {
              return std::binary_search(worker_cpu_list_.begin(), worker_cpu_list_.end(), cpu);
            });
    checked_team = id_;
  }
  return apart;
}

void WorkerTeam::run(Job job, void* context) {
  const bool joins = caller_apart();
  job_ = job;
  context_ = context;
  participants_ = size() + (joins ? 1 : 0);
  finished_.store(0, std::memory_order_relaxed);
  // seq_cst pairs with the worker's parked_ increment: either it sees the new generation before sleeping,
  // or we see it parked and wake it.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (parked_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&generation_);
  if (joins) job(context, size());
  while (finished_.load(std::memory_order_acquire) < size()) spin_pause();
}

void WorkerTeam::barrier() {
  const uint32_t epoch = barrier_epoch_.load(std::memory_order_acquire);
  if (barrier_arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == participants_) {
    barrier_arrived_.store(0, std::memory_order_relaxed);
    barrier_epoch_.store(epoch + 1, std::memory_order_release);
    return;
  }
  while (barrier_epoch_.load(std::memory_order_acquire) == epoch) spin_pause();
}

void WorkerTeam::worker_main(int index, std::vector<int> cpus) {
  if (!cpus.empty()) {
    try {
      pin_current_thread(cpus);
    } catch (const Error&) {
      // An unpinnable CPU (hot-unplugged since the topology was read) leaves this worker floating.
    }
  }
  uint32_t seen = generation_.load(std::memory_order_acquire);
  started_.fetch_add(1, std::memory_order_release);
  using Clock = std::chrono::steady_clock;
  const auto spin_for = std::chrono::microseconds(spin_us_);
  for (;;) {
    auto idle_since = Clock::now();
    uint32_t now = seen;
    for (unsigned polls = 0;; ++polls) {
      now = generation_.load(std::memory_order_acquire);
      if (now != seen) break;
      spin_pause();
      if ((polls & 255) == 255 && Clock::now() - idle_since >= spin_for) {
        parked_.fetch_add(1, std::memory_order_seq_cst);
        if (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(&generation_, seen);
        parked_.fetch_sub(1, std::memory_order_seq_cst);
        idle_since = Clock::now();
      }
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    job_(context_, index);
    finished_.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace strata::cpu
