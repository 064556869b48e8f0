// A job's work items handed to its participants as contiguous runs. Participant p claims the items of its own
// segment first, one after another, so that the rows it reads follow one another in memory and the core's
// prefetchers keep streaming from one item into the next (a single shared counter hands each participant every
// P-th item: each item then starts a new stream). Once its segment is spent it claims from the others', from
// p + 1 on, so a late or slow participant's items are taken over. Each item is claimed exactly once.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace strata::cpu {

class ItemClaims {
 public:
  explicit ItemClaims(int max_parts) : segments_(std::make_unique<Segment[]>(max_parts)), max_parts_(max_parts) {}

  // Before the job (by the thread that hands it over): items [0, items) in `parts` near-equal segments (parts is
  // clamped to 1 .. the constructor's max_parts; 1: one shared counter, every item in claim order).
  void reset(int64_t items, int parts) {
    parts_ = std::clamp(parts, 1, max_parts_);
    for (int s = 0; s < parts_; ++s) {
      segments_[s].next.store(items * s / parts_, std::memory_order_relaxed);
      segments_[s].end = items * (s + 1) / parts_;
    }
  }

  // work(item) for every item participant p claims, in the order it claims them; returns once every item is
  // claimed (the others may still be working on theirs).
  template <class Work>
  void each(int p, Work&& work) {
    // `from`: how far past its own segment p has moved; a segment found spent stays spent.
    for (int from = 0; from < parts_; ++from) {
      Segment& s = segments_[(p + from) % parts_];
      while (s.next.load(std::memory_order_relaxed) < s.end) {
        const int64_t item = s.next.fetch_add(1, std::memory_order_relaxed);
        if (item >= s.end) break;
        work(item);
      }
    }
  }

 private:
  struct alignas(64) Segment {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Segment[]> segments_;
  int max_parts_;
  int parts_ = 1;
};

}  // namespace strata::cpu
