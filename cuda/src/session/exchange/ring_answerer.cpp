#include "ring_answerer.hpp"

#include <algorithm>
#include <string>

#include "strata/error.hpp"

namespace strata {
namespace {

void grow_stats(int layer, ExchangeStats& stats) {
  if (static_cast<int>(stats.hits.size()) <= layer) {
    stats.hits.resize(layer + 1, 0);
    stats.misses.resize(layer + 1, 0);
  }
}

}  // namespace

RingAnswerer::RingAnswerer(cpu::ExpertPool& pool, DoorbellHost& bell, ExpertCache* cache, ExpertDeferral deferral)
    : pool_(pool),
      bell_(bell),
      cache_(cache),
      deferral_(deferral),
      held_(static_cast<std::size_t>(bell.rows()) * bell.k()),
      now_(bell.k()),
      later_(bell.k()),
      deferred_x_(deferral.experts > 0 ? bell.n() : 0),
      deferred_weights_(deferral.experts > 0 ? bell.k() : 0),
      deferred_ids_(deferral.experts > 0 ? bell.k() : 0) {}

// Layer l's deferred experts, weighted by l's own routing weights, into deferred row l % 2; written before the
// answer to ring l + 1, whose flag the GPU waits for before it reads the row.
void RingAnswerer::answer_deferred(ExchangeStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  pool_.run_layer_sum(deferred_layer_, deferred_x_.data(), deferred_ids_.data(), deferred_weights_.data(),
                      later_.data(), bell_.k(), bell_.deferred(deferred_layer_ % 2));
  stats.pool_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void RingAnswerer::await_ring(int layer, int ring, std::chrono::nanoseconds timeout) const {
  if (!bell_.wait_for_ring(ring, timeout)) {
    throw Error("layer " + std::to_string(layer) + " never rang: waited " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                " ms for ring " + std::to_string(ring) + ", the last ring seen was " +
                std::to_string(bell_.last_ring()));
  }
  // The GPU rings each layer in turn, and cannot ring the next before this one is answered unless its wait
  // for this answer gave up: a later ring here means this layer's ring never came.
  if (const int seen = bell_.last_ring(); seen != ring) {
    throw Error("layer " + std::to_string(layer) + " never rang: the GPU rang " + std::to_string(seen) +
                " while the host waited for ring " + std::to_string(ring));
  }
}

void RingAnswerer::note_routing(int layer, const std::int32_t* ids, int rows, ExchangeStats& stats) {
  const int k = bell_.k();
  int held = 0;
  for (int p = 0; p < rows * k; ++p) held += held_[p] = cache_ && cache_->holds(layer, ids[p]);
  if (cache_) {  // after the skips: the map changes only between tokens
    for (int r = 0; r < rows; ++r) cache_->note_routed(layer, ids + r * k, k);
  }
  stats.hits[layer] += held;
  stats.misses[layer] += rows * k - held;
}

void RingAnswerer::answered(int ring, Clock::time_point start, Clock::time_point rung, ExchangeStats& stats) {
  bell_.answer_ready(ring);
  const auto done = Clock::now();
  stats.ring_wait_seconds += std::chrono::duration<double>(rung - start).count();
  stats.pool_seconds += std::chrono::duration<double>(done - rung).count();
  ++stats.rings;
}

void RingAnswerer::answer(int layer, int ring, std::chrono::nanoseconds timeout, ExchangeStats& stats) {
  const int n = bell_.n(), k = bell_.k();
  // A token cut short leaves its due layer behind: only the layer just before this one is due now.
  if (deferred_layer_ >= 0 && deferred_layer_ == layer - 1) answer_deferred(stats);
  deferred_layer_ = -1;
  grow_stats(layer, stats);
  if (cache_ && cache_->holds_all(layer)) {
    stats.hits[layer] += k;
    return;
  }
  const auto start = Clock::now();
  await_ring(layer, ring, timeout);
  const auto rung = Clock::now();
  const std::int32_t* ids = bell_.ids();
  note_routing(layer, ids, 1, stats);
  // Deferred: the last `experts` of the pool's slots (moe_route orders them by descending weight).
  const bool defers = deferral_.defers(layer, cache_);
  std::copy(held_.begin(), held_.begin() + k, now_.begin());
  std::fill(later_.begin(), later_.end(), std::uint8_t{1});
  for (int j = k - 1, left = defers ? deferral_.experts : 0; j >= 0 && left > 0; --j) {
    if (held_[j]) continue;
    now_[j] = 1;
    later_[j] = 0;
    --left;
  }
  pool_.run_layer_sum(layer, bell_.x(), ids, bell_.weights(), now_.data(), k, bell_.answer());
  if (defers) {
    std::copy(bell_.x(), bell_.x() + n, deferred_x_.begin());
    std::copy(ids, ids + k, deferred_ids_.begin());
    std::copy(bell_.weights(), bell_.weights() + k, deferred_weights_.begin());
    deferred_layer_ = layer;
  }
  answered(ring, start, rung, stats);
}

void RingAnswerer::answer_rows(int layer, int ring, int rows, std::chrono::nanoseconds timeout,
                               ExchangeStats& stats) {
  STRATA_EXPECTS(rows >= 1 && rows <= bell_.rows(), InvalidArgument,
                 "a ring of " + std::to_string(rows) + " rows on a doorbell of " + std::to_string(bell_.rows()));
  grow_stats(layer, stats);
  const auto start = Clock::now();
  await_ring(layer, ring, timeout);
  const auto rung = Clock::now();
  note_routing(layer, bell_.ids(), rows, stats);
  pool_.run_rows_sum(layer, bell_.x(), bell_.ids(), bell_.weights(), held_.data(), rows, bell_.k(), bell_.answer());
  answered(ring, start, rung, stats);
}

}  // namespace strata
