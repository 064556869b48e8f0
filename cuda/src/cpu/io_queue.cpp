#include "io_queue.hpp"

#include "strata/error.hpp"

namespace strata::cpu {

IoQueue::IoQueue(int threads, int capacity) : ring_(static_cast<size_t>(capacity)) {
  STRATA_EXPECTS(threads >= 1 && threads <= 256, InvalidArgument,
                 "expert file: io_threads must be in 1..256, found " + std::to_string(threads));
  STRATA_EXPECTS(capacity >= 1, InvalidArgument, "expert file: the I/O queue needs room for a read");
  threads_.reserve(threads);
  try {
    for (int i = 0; i < threads; ++i) threads_.emplace_back(&IoQueue::thread_main, this);
  } catch (...) {
    stop();  // joins the threads already started: nothing half-built stays behind
    throw;
  }
}

IoQueue::~IoQueue() { stop(); }

void IoQueue::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void IoQueue::submit(IoTask* task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    STRATA_EXPECTS(count_ < ring_.size(), InvalidArgument,
                   "expert file: more reads queued than the staging holds (" + std::to_string(ring_.size()) + ")");
    ring_[(head_ + count_) % ring_.size()] = task;
    ++count_;
  }
  ready_.notify_one();
}

void IoQueue::thread_main() {
  for (;;) {
    IoTask* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stop_ || count_ > 0; });
      if (count_ == 0) return;  // stopping, and every queued read has run
      task = ring_[head_];
      head_ = (head_ + 1) % ring_.size();
      --count_;
    }
    task->run();
  }
}

}  // namespace strata::cpu
