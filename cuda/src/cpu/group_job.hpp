// The grouped job of ExpertPool::run_groups: rows of a prompt chunk, grouped by the expert they chose, through
// their expert's gate, up and down. Each work item is (row block of one group) x (output-row range): its
// weight rows come from DRAM once and serve every row of the block from the caches, so the call streams the
// experts' weights about once, not once per row.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "activation.hpp"
#include "expert_load.hpp"
#include "item_claims.hpp"
#include "pool_layer.hpp"
#include "worker_team.hpp"

namespace strata::cpu {

class GroupJob {
 public:
  // Scratch for up to max_rows rows of x (their q8_32), h and h's q8_32, allocated here once, for jobs of up to
  // max_participants participants.
  GroupJob(int64_t n_embd, int64_t ff, int max_rows, int max_participants);

  int max_rows() const { return max_rows_; }

  // out row r = down(silu(gate x_r) * up x_r) of the expert refs[g] finds for every row r in
  // begin[g]..begin[g+1]-1, computed by the per-token job's code on each row; an item of an expert still arriving
  // from the file waits for it (and skips its rows if the read failed: the caller throws then). The caller has
  // validated the arguments (begin from 0, non-decreasing, begin[groups] <= max_rows). Blocking; allocates
  // nothing. `contiguous`: each participant claims a contiguous run of the items first (ItemClaims), else all
  // claim them in order from one counter.
  void run(WorkerTeam& team, const PoolLayer& layer, const float* x, const ExpertRef* refs, const int* begin,
           int groups, float* out, bool contiguous);

 private:
  struct RowBlock {
    const ExpertRef* expert;
    int32_t row0, row1;
  };

  static void job(void* context, int worker);
  void quantize_item(int64_t item);
  void gate_up_item(int64_t item);
  void down_item(int64_t item);
  Activation x_row(int64_t r);
  Activation h_row(int64_t r);

  int64_t n_embd_, ff_;
  int max_rows_;
  std::vector<float> h_;     // [max_rows][ff]
  QuantizedRows x_q_, h_q_;  // [max_rows] of n_embd / ff elements
  std::vector<RowBlock> blocks_;  // [max_rows]: a block holds at least one row
  int64_t gate_up_per_block_, down_per_block_;

  // The call in flight (written by run before WorkerTeam::run, read by the workers).
  WorkerTeam* team_ = nullptr;
  const PoolLayer* layer_ = nullptr;
  const float* x_ = nullptr;
  float* out_ = nullptr;
  int64_t rows_ = 0, n_blocks_ = 0, quantize_items_ = 0;
  alignas(64) std::atomic<int64_t> next_quantize_{0};
  ItemClaims gate_up_claims_, down_claims_;
};

}  // namespace strata::cpu
