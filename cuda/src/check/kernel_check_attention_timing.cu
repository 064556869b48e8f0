// Timings of the decode attention kernels (attention_decode, qsa_select and its selection step alone) for
// benchmarks/bench_attention.py. The cache holds arbitrary finite values (the time does not depend on them)
// and every timed launch starts with the L2 cache overwritten, as in a decode step, where the other layers'
// weights pass through it between two calls of one layer's attention.
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "../kernels/attention.cuh"
#include "../kernels/qsa.cuh"
#include "../runtime/stream.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_mixers.hpp"

namespace strata::kernel_check {
namespace {

using support::upload;

constexpr std::size_t kEvictBytes = std::size_t{256} << 20;  // written before each launch: above any L2
constexpr unsigned char kFinite = 0x3C;  // as every byte: small finite bf16, f32 and fp16 values, int8 codes 60

DeviceBuffer finite_buffer(std::size_t bytes) {
  DeviceBuffer buffer(bytes);
  STRATA_CUDA_TRY(cudaMemset(buffer.as<void>(), kFinite, bytes));
  return buffer;
}

// Median seconds of launch() over `reps` launches, each timed alone between two events after the L2 cache was
// overwritten.
template <class Launch>
double median_cold_seconds(int reps, cudaStream_t stream, Launch&& launch) {
  STRATA_EXPECTS(reps > 0, InvalidArgument, "timing needs reps > 0, got " + std::to_string(reps));
  DeviceBuffer evict(kEvictBytes);
  std::vector<cudaEvent_t> events(2 * static_cast<std::size_t>(reps), nullptr);
  const auto destroy = [&] {
    for (cudaEvent_t e : events)
      if (e != nullptr) (void)cudaEventDestroy(e);
  };
  std::vector<double> seconds;
  try {
    for (cudaEvent_t& e : events) STRATA_CUDA_TRY(cudaEventCreate(&e));
    STRATA_CUDA_TRY(launch(stream));  // warm-up: clocks, TLB, module load
    for (int r = 0; r < reps; ++r) {
      STRATA_CUDA_TRY(cudaMemsetAsync(evict.as<void>(), r & 255, kEvictBytes, stream));
      STRATA_CUDA_TRY(cudaEventRecord(events[2 * r], stream));
      STRATA_CUDA_TRY(launch(stream));
      STRATA_CUDA_TRY(cudaEventRecord(events[2 * r + 1], stream));
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
    for (int r = 0; r < reps; ++r) {
      float ms = 0.0f;
      STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
      seconds.push_back(ms * 1e-3);
    }
  } catch (...) {
    destroy();
    throw;
  }
  destroy();
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return seconds[reps / 2];
}

// The query's selection as the indexer would leave it deep in a context: keep of the n_blocks complete blocks,
// spread evenly over them, ascending.
std::vector<int> spread_selection(int n_blocks, int keep) {
  std::vector<int> chosen(std::max(keep, 1));
  for (int i = 0; i < keep; ++i) chosen[i] = static_cast<int>(static_cast<long>(i) * n_blocks / keep);
  return chosen;
}

}  // namespace

double time_attention_decode(int device, const AttentionTimingShape& s, int reps) {
  STRATA_EXPECTS(s.context > 0 && s.page_size > 0 && s.page_size % 4 == 0 && s.ratio > 0 && s.keep_blocks >= 0,
                 InvalidArgument,
                 "time_attention_decode: need context > 0, page_size a positive multiple of 4, ratio > 0 and "
                 "keep_blocks >= 0, got " + std::to_string(s.context) + ", " + std::to_string(s.page_size) + ", " +
                     std::to_string(s.ratio) + ", " + std::to_string(s.keep_blocks));
  const kernels::AttentionShape shape{s.n_head, s.n_head_kv, s.head_dim, 0, 1e-6f};
  STRATA_EXPECTS(kernels::attention_decode_fits(shape), InvalidArgument,
                 "time_attention_decode: the decode kernel does not take " + std::to_string(s.n_head) +
                     " q heads over " + std::to_string(s.n_head_kv) + " kv heads of " + std::to_string(s.head_dim));
  support::check_device(device);
  DeviceScope scope(device);
  const int n_pages = (s.context + s.page_size - 1) / s.page_size;
  const std::size_t elements = static_cast<std::size_t>(n_pages) * s.n_head_kv * s.page_size * s.head_dim;
  const KvCodes key_codes = kv_key_codes(s.kv), value_codes = kv_value_codes(s.kv);
  DeviceBuffer keys = finite_buffer(kv_half_bytes(key_codes, elements));
  DeviceBuffer values = finite_buffer(kv_half_bytes(value_codes, elements));
  std::vector<int> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = n_pages - 1 - i;  // no help from neighbouring pages
  DeviceBuffer table = upload(pages.data(), pages.size() * sizeof(int));
  const kernels::PagedKv kv{kernels::kv_half(key_codes, keys.as<void>(), elements),
                            kernels::kv_half(value_codes, values.as<void>(), elements), s.n_head_kv, s.head_dim,
                            s.page_size, n_pages, table.as<int>()};
  const std::size_t hd = static_cast<std::size_t>(s.n_head) * s.head_dim;
  DeviceBuffer q = finite_buffer(hd * sizeof(float)), q_gate = finite_buffer(2 * hd * sizeof(float));
  DeviceBuffer out(hd * sizeof(float));
  DeviceBuffer partials(kernels::attention_decode_partial_floats(shape) * sizeof(float));
  const int position = s.context - 1, n_blocks = s.context / s.ratio;
  const int keep = std::min(s.keep_blocks, n_blocks);
  DeviceBuffer d_position = upload(&position, sizeof(int)), d_keep = upload(&keep, sizeof(int));
  const std::vector<int> chosen = spread_selection(n_blocks, keep);
  DeviceBuffer selected = upload(chosen.data(), chosen.size() * sizeof(int));
  kernels::AttentionDecodeArgs args;
  args.q = q.as<float>();
  args.q_gate = q_gate.as<float>();
  args.position = d_position.as<int>();
  if (s.keep_blocks > 0) {
    args.selected_blocks = selected.as<int>();
    args.n_selected = d_keep.as<int>();
  }
  args.block_tokens = s.ratio;
  args.out = out.as<float>();
  kernels::carve_attention_partials(shape, partials.as<float>(), args);
  Stream stream;
  return median_cold_seconds(reps, stream.get(),
                             [&](cudaStream_t on) { return kernels::attention_decode(shape, args, kv, on); });
}

double time_qsa_select(int device, const IndexerTimingShape& s, bool top_only, int reps) {
  STRATA_EXPECTS(s.context > 0 && s.n_heads > 0 && s.head_dim > 0 && s.head_dim % 32 == 0 && s.ratio > 0 &&
                     s.keep_blocks > 0,
                 InvalidArgument,
                 "time_qsa_select: need context, n_heads, ratio, keep_blocks > 0 and head_dim a positive multiple "
                 "of 32, got " + std::to_string(s.context) + ", " + std::to_string(s.n_heads) + ", " +
                     std::to_string(s.ratio) + ", " + std::to_string(s.keep_blocks) + ", " +
                     std::to_string(s.head_dim));
  support::check_device(device);
  DeviceScope scope(device);
  const int max_blocks = s.context / s.ratio + 1, rope_dim = std::min(64, s.head_dim);
  const kernels::IndexerShape shape{s.n_heads, s.head_dim, s.ratio, s.keep_blocks, rope_dim, max_blocks, 1e-6f};
  // Scores that differ, as the radix passes meet them: random block keys and query.
  std::mt19937 gen(12345);
  std::normal_distribution<float> normal;
  std::vector<float> keys(static_cast<std::size_t>(max_blocks) * s.head_dim), query(s.n_heads * s.head_dim);
  for (float& x : keys) x = normal(gen);
  for (float& x : query) x = normal(gen);
  DeviceBuffer block_keys = upload(keys.data(), keys.size() * sizeof(float));
  DeviceBuffer q = upload(query.data(), query.size() * sizeof(float));
  DeviceBuffer norm = finite_buffer(s.head_dim * sizeof(float));
  DeviceBuffer rope = finite_buffer(static_cast<std::size_t>(s.context) * rope_dim / 2 * sizeof(float));
  const int position = s.context - 1;
  DeviceBuffer d_position = upload(&position, sizeof(int));
  DeviceBuffer scores(max_blocks * sizeof(float)), selected(s.keep_blocks * sizeof(int)), count(sizeof(int));
  const kernels::IndexerCache cache{nullptr, block_keys.as<float>()};
  const kernels::IndexerSelectArgs args{q.as<float>(), norm.as<float>(), rope.as<float>(), rope.as<float>(),
                                        d_position.as<int>(), scores.as<float>(), selected.as<int>(),
                                        count.as<int>()};
  Stream stream;
  if (top_only) STRATA_CUDA_TRY(kernels::qsa_select(shape, cache, args, stream.get()));  // the scores it selects
  return median_cold_seconds(reps, stream.get(), [&](cudaStream_t on) {
    return top_only ? kernels::qsa_top_blocks(shape, args, on) : kernels::qsa_select(shape, cache, args, on);
  });
}

}  // namespace strata::kernel_check
