#include "group_job.hpp"

#include <algorithm>

#include "expert_hidden.hpp"

namespace strata::cpu {
namespace {

// Output rows per work item, as the per-token job: gate/up items are whole q8_32 blocks of h, so an item can
// quantize what it made.
constexpr int64_t kGateUpRows = 32;
constexpr int64_t kDownRows = 64;
// Rows of a group per block: one pass of an item over its weight rows serves them all from the caches (a
// 32-row gate+up tile of the benchmark model is 92 KB, L2-resident), while their activations (about 8 KB a
// row) stay in L2 too. A group of more rows splits into near-equal blocks, which also spreads a few large
// groups over the workers.
constexpr int64_t kBlockRows = 128;
// Rows of x each quantization item quantizes.
constexpr int64_t kQuantizeRows = 8;

}  // namespace

GroupJob::GroupJob(int64_t n_embd, int64_t ff, int max_rows, int max_participants)
    : n_embd_(n_embd), ff_(ff), max_rows_(max_rows), h_(static_cast<size_t>(max_rows) * ff),
      x_q_(max_rows, n_embd), h_q_(max_rows, ff), blocks_(max_rows),
      gate_up_per_block_((ff + kGateUpRows - 1) / kGateUpRows), down_per_block_((n_embd + kDownRows - 1) / kDownRows),
      gate_up_claims_(max_participants), down_claims_(max_participants) {}

Activation GroupJob::x_row(int64_t r) { return {x_ + r * n_embd_, x_q_.row(r)}; }

Activation GroupJob::h_row(int64_t r) { return {h_.data() + r * ff_, h_q_.row(r)}; }

void GroupJob::quantize_item(int64_t item) {
  const int64_t r1 = std::min(rows_, (item + 1) * kQuantizeRows);
  for (int64_t r = item * kQuantizeRows; r < r1; ++r) quantize_blocks(x_ + r * n_embd_, 0, n_embd_ / 32, x_q_.row(r));
}

void GroupJob::gate_up_item(int64_t item) {
  const RowBlock& b = blocks_[item / gate_up_per_block_];
  const int64_t o0 = (item % gate_up_per_block_) * kGateUpRows, o1 = std::min(ff_, o0 + kGateUpRows);
  const PoolLayer& l = *layer_;
  if (!b.expert->gate_up_ready()) return;
  const MatrixRows &gate = b.expert->gate, &up = b.expert->up;
  for (int64_t r = b.row0; r < b.row1; ++r) {
    const Activation h = h_row(r);
    float* hr = h_.data() + r * ff_;
    expert_hidden(l.gate_kernel, gate, l.up_kernel, up, o0, o1, x_row(r), hr + o0);
    if (l.quantize_h) quantize_blocks(hr, o0 / 32, o1 / 32, h.q);
  }
}

void GroupJob::down_item(int64_t item) {
  const RowBlock& b = blocks_[item / down_per_block_];
  const int64_t o0 = (item % down_per_block_) * kDownRows, o1 = std::min(n_embd_, o0 + kDownRows);
  const PoolLayer& l = *layer_;
  if (!b.expert->down_ready()) return;
  const MatrixRows& down = b.expert->down;
  for (int64_t r = b.row0; r < b.row1; ++r) l.down_kernel(down, o0, o1, h_row(r), 1.0f, out_ + r * n_embd_ + o0);
}

void GroupJob::job(void* context, int participant) {
  auto& j = *static_cast<GroupJob*>(context);
  for (int64_t i; (i = j.next_quantize_.fetch_add(1, std::memory_order_relaxed)) < j.quantize_items_;)
    j.quantize_item(i);
  j.team_->barrier();  // every row's q8_32 of x is complete
  j.gate_up_claims_.each(participant, [&](int64_t i) { j.gate_up_item(i); });
  j.team_->barrier();  // every h is complete and quantized
  j.down_claims_.each(participant, [&](int64_t i) { j.down_item(i); });
}

void GroupJob::run(WorkerTeam& team, const PoolLayer& layer, const float* x, const ExpertRef* refs, const int* begin,
                   int groups, float* out, bool contiguous) {
  n_blocks_ = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t rows = begin[g + 1] - begin[g];
    const int64_t n = (rows + kBlockRows - 1) / kBlockRows;
    for (int64_t k = 0; k < n; ++k)  // near-equal blocks: k * rows / n .. (k + 1) * rows / n
      blocks_[n_blocks_++] = {refs + g, static_cast<int32_t>(begin[g] + k * rows / n),
                              static_cast<int32_t>(begin[g] + (k + 1) * rows / n)};
  }
  rows_ = groups == 0 ? 0 : begin[groups];
  if (n_blocks_ == 0) return;
  team_ = &team;
  layer_ = &layer;
  x_ = x;
  out_ = out;
  quantize_items_ = layer.quantize_x ? (rows_ + kQuantizeRows - 1) / kQuantizeRows : 0;
  next_quantize_.store(0, std::memory_order_relaxed);
  const int parts = contiguous ? team.participants() : 1;
  gate_up_claims_.reset(n_blocks_ * gate_up_per_block_, parts);
  down_claims_.reset(n_blocks_ * down_per_block_, parts);
  team.run(&GroupJob::job, this);
}

}  // namespace strata::cpu
