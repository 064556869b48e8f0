#include "rows_sum.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata::cpu {

void RowsSum::run(ExpertPool& pool, int layer, const float* x, const std::int32_t* ids, const float* weights,
                  const std::uint8_t* skip, int rows, int k, float* out) {
  STRATA_EXPECTS(rows >= 0 && k >= 0, InvalidArgument,
                 "run_rows_sum: layer " + std::to_string(layer) + " takes rows >= 0 and k >= 0, got " +
                     std::to_string(rows) + " and " + std::to_string(k));
  const std::int64_t n = n_embd_;
  const int slots = rows * k;
  pairs_.clear();
  for (int p = 0; p < slots; ++p) {
    if (!skip || !skip[p]) pairs_.push_back(p);
  }
  // By expert, each expert's rows in (row, slot) order: a group is one expert's consecutive rows.
  std::stable_sort(pairs_.begin(), pairs_.end(), [&](int a, int b) { return ids[a] < ids[b]; });
  const int routed = static_cast<int>(pairs_.size());
  grouped_at_.assign(slots, -1);
  experts_.clear();
  begin_.clear();
  in_.resize(static_cast<std::size_t>(routed) * n);
  out_.resize(static_cast<std::size_t>(routed) * n);
  for (int i = 0; i < routed; ++i) {
    const int p = pairs_[i];
    if (experts_.empty() || experts_.back() != ids[p]) {
      experts_.push_back(ids[p]);
      begin_.push_back(i);
    }
    grouped_at_[p] = i;
    std::memcpy(in_.data() + i * n, x + static_cast<std::int64_t>(p / k) * n, sizeof(float) * n);
  }
  begin_.push_back(routed);
  const int groups = static_cast<int>(experts_.size());
  pool.run_groups(layer, in_.data(), experts_.data(), begin_.data(), groups, out_.data());
  // Each pair's row weighted once, stored (the one rounding run_layer's row has), then each row's sum in slot
  // order from zero, as run_layer_sum adds its rows.
  for (int i = 0; i < routed; ++i) {
    const float w = weights[pairs_[i]];
    float* row = out_.data() + i * n;
    for (std::int64_t c = 0; c < n; ++c) row[c] = w * row[c];
  }
  for (int r = 0; r < rows; ++r) {
    float* sum = out + static_cast<std::int64_t>(r) * n;
    std::fill(sum, sum + n, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int at = grouped_at_[r * k + j];
      if (at < 0) continue;
      const float* row = out_.data() + static_cast<std::int64_t>(at) * n;
      for (std::int64_t c = 0; c < n; ++c) sum[c] += row[c];
    }
  }
}

}  // namespace strata::cpu
