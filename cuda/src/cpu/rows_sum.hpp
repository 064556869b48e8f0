// The routed experts of several rows in one grouped call (ExpertPool::run_rows_sum): a step of several rows (a
// batch of sessions, a verification's drafts) routes each row to its own k experts, and the union of them is
// what the pool reads. The rows' (row, slot) pairs are grouped by expert, each expert computed once for all its
// rows (run_groups), each pair's row weighted, and each row summed in slot order from zero: what run_layer_sum
// gives each row alone, bit for bit (run_groups' rows are run_layer's with weight 1, and the weight is the same
// one multiply the down kernel's scale makes).
#pragma once

#include <cstdint>
#include <vector>

namespace strata::cpu {

class ExpertPool;

class RowsSum {
 public:
  explicit RowsSum(std::int64_t n_embd) : n_embd_(n_embd) {}

  // out[r] = pool.run_layer_sum(layer, x[r], ids[r], weights[r], skip[r], k) for r < rows (x, out [rows][n_embd];
  // ids, weights, skip [rows][k]; skip may be null). Grows its scratch to the largest call seen.
  void run(ExpertPool& pool, int layer, const float* x, const std::int32_t* ids, const float* weights,
           const std::uint8_t* skip, int rows, int k, float* out);

 private:
  std::int64_t n_embd_;
  std::vector<int> pairs_;            // the pairs not skipped (r * k + j), ordered by expert, then r, then j
  std::vector<int> grouped_at_;       // [rows * k] each pair's row in the grouped order (-1: skipped)
  std::vector<std::int32_t> experts_;  // per group
  std::vector<int> begin_;            // per group, and the end
  std::vector<float> in_, out_;       // [pairs][n_embd] the grouped x rows and the experts' rows
};

}  // namespace strata::cpu
