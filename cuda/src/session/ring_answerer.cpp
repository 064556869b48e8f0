#include "ring_answerer.hpp"

#include <algorithm>
#include <string>

#include "strata/error.hpp"

namespace strata {

RingAnswerer::RingAnswerer(cpu::ExpertPool& pool, DoorbellHost& bell, ExpertCache* cache)
    : pool_(pool), bell_(bell), cache_(cache), rows_(static_cast<std::size_t>(bell.k()) * bell.n()), held_(bell.k()) {}

void RingAnswerer::answer(int layer, int ring, std::chrono::nanoseconds timeout, ExchangeStats& stats) {
  using clock = std::chrono::steady_clock;
  const int n = bell_.n(), k = bell_.k();
  if (static_cast<int>(stats.hits.size()) <= layer) {
    stats.hits.resize(layer + 1, 0);
    stats.misses.resize(layer + 1, 0);
  }
  if (cache_ && cache_->holds_all(layer)) {
    stats.hits[layer] += k;
    return;
  }
  const auto start = clock::now();
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
  const auto rung = clock::now();
  const std::int32_t* ids = bell_.ids();
  int held = 0;
  for (int j = 0; j < k; ++j) held += held_[j] = cache_ && cache_->holds(layer, ids[j]);
  if (cache_) cache_->note_routed(layer, ids, k);  // after the skips: the map changes only between tokens
  stats.hits[layer] += held;
  stats.misses[layer] += k - held;
  pool_.run_layer(layer, bell_.x(), ids, bell_.weights(), held_.data(), k, rows_.data());
  float* answer = bell_.answer();
  std::fill(answer, answer + n, 0.0f);
  for (int j = 0; j < k; ++j) {
    if (held_[j]) continue;
    const float* row = rows_.data() + static_cast<std::size_t>(j) * n;
    for (int i = 0; i < n; ++i) answer[i] += row[i];
  }
  bell_.answer_ready(ring);
  const auto done = clock::now();
  stats.ring_wait_seconds += std::chrono::duration<double>(rung - start).count();
  stats.pool_seconds += std::chrono::duration<double>(done - rung).count();
  ++stats.rings;
}

}  // namespace strata
