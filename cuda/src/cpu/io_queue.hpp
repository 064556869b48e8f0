// The disk tier's I/O threads: each takes a read off the queue and blocks in it, so that as many reads are in
// flight as there are threads while the pool's workers compute. A thread pool of blocking reads, not io_uring:
// the wheel then needs no liburing, io_uring is often switched off in containers (seccomp, the
// kernel.io_uring_disabled sysctl), and the tier's reads are large (pieces of an expert's matrix, 256 KiB and
// up), so a few threads keep an NVMe drive's queue full. The threads only read: the repack into canonical form
// runs on the pool's pinned participants that need the expert (expert_load.hpp), so no CPU work waits for an I/O
// thread to be scheduled beside spinning workers.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::cpu {

// A read handed to the queue: run() does it and records its outcome; it must not throw.
class IoTask {
 public:
  virtual void run() noexcept = 0;

 protected:
  ~IoTask() = default;
};

class IoQueue {
 public:
  // `threads` I/O threads (unpinned: they sleep in their reads) and room for `capacity` queued tasks.
  IoQueue(int threads, int capacity);
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // Queues `task`; an I/O thread runs it. The queue holds at most `capacity` tasks not yet taken: the caller
  // (the tier) never has more reads outstanding than its staging has room for. Allocates nothing.
  void submit(IoTask* task);

  int threads() const noexcept { return static_cast<int>(threads_.size()); }

 private:
  void thread_main();
  void stop() noexcept;  // lets the queued reads run, then joins the threads

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<IoTask*> ring_;  // [capacity]
  size_t head_ = 0, count_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::cpu
