// kernel_check round trip of the chunk attention kernels against the decode kernels run token by token: both
// paths start from one cache state and get the same inputs, and the test compares what each leaves. The chunk
// runs through a captured CUDA graph, as the prompt program runs it.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "../kernels/attention.cuh"
#include "../kernels/attention_chunk.cuh"
#include "../kernels/qsa.cuh"
#include "../kernels/qsa_chunk.cuh"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "kernel_check_support.hpp"
#include "kv_readback.hpp"
#include "strata/check/kernel_check_attention_chunk.hpp"

namespace strata::kernel_check {
namespace {

using support::GuardedOutput;
using support::upload;

void copy_in(DeviceBuffer& dst, const void* host, std::size_t bytes) {
  STRATA_CUDA_TRY(cudaMemcpy(dst.as<void>(), host, bytes, cudaMemcpyHostToDevice));
}

void launched(cudaError_t error, const char* launcher) {
  STRATA_EXPECTS(error == cudaSuccess, InvalidArgument,
                 std::string("attention_chunk_vs_decode: ") + launcher + " refused its arguments (" +
                     cudaGetErrorName(error) + ")");
}

// One path's state: the paged KV cache halves and the indexer caches, poisoned inside guard bands.
struct PathState {
  PathState(std::size_t key_bytes, std::size_t value_bytes, std::size_t raw_bytes, std::size_t block_bytes)
      : keys(key_bytes), values(value_bytes), raw_keys(raw_bytes), block_keys(block_bytes),
        sizes{key_bytes, value_bytes, raw_bytes, block_bytes} {}

  // This state becomes a copy of `other` (the guard bands stay this state's own).
  void copy_from(const PathState& other) {
    const GuardedOutput* mine[] = {&keys, &values, &raw_keys, &block_keys};
    const GuardedOutput* theirs[] = {&other.keys, &other.values, &other.raw_keys, &other.block_keys};
    for (int i = 0; i < 4; ++i)
      STRATA_CUDA_TRY(cudaMemcpy(mine[i]->data<void>(), theirs[i]->data<void>(), sizes[i], cudaMemcpyDeviceToDevice));
  }

  GuardedOutput keys, values, raw_keys, block_keys;
  std::size_t sizes[4];
};

// Fills `to` with what a path left in `state` (see ChunkCheckOutputs).
void read_state(const PathState& state, const AttentionCheckShape& s, std::size_t elements, int tokens,
                const int* page_order, bool qsa, const ChunkCheckOutputs& to) {
  const KvCodes key_codes = kv_key_codes(s.kv), value_codes = kv_value_codes(s.kv);
  std::vector<unsigned char> bytes(state.sizes[0]);
  state.keys.copy_out(bytes.data(), "k cache");
  std::copy(bytes.begin(), bytes.end(), to.k_bytes);
  support::dequant_cache(bytes, key_codes, elements, s, tokens, page_order, to.k_cache);
  bytes.resize(state.sizes[1]);
  state.values.copy_out(bytes.data(), "v cache");
  std::copy(bytes.begin(), bytes.end(), to.v_bytes);
  support::dequant_cache(bytes, value_codes, elements, s, tokens, page_order, to.v_cache);
  if (!qsa) return;
  state.raw_keys.copy_out(to.raw_keys, "indexer raw keys");
  state.block_keys.copy_out(to.block_keys, "indexer block keys");
}

// A selection read back: `count` blocks, -1 after them up to keep.
void pad_selection(const int* blocks, int count, int keep, int* dst) {
  for (int b = 0; b < keep; ++b) dst[b] = b < count ? blocks[b] : -1;
}

}  // namespace

std::size_t attention_chunk_scratch(const AttentionCheckShape& s, int chunk) {
  return kernels::attention_chunk_scratch_floats({s.n_head, s.n_head_kv, s.head_dim, s.rope_dim, s.eps}, chunk);
}

int attention_chunk_spans(const AttentionCheckShape& s, int chunk, bool gathered) {
  return kernels::attention_chunk_spans({s.n_head, s.n_head_kv, s.head_dim, s.rope_dim, s.eps}, chunk, gathered);
}

std::size_t chunk_cache_bytes(const AttentionCheckShape& s, int n_pages, bool values) {
  const std::size_t elements = static_cast<std::size_t>(n_pages) * s.n_head_kv * s.page_size * s.head_dim;
  return kv_half_bytes(values ? kv_value_codes(s.kv) : kv_key_codes(s.kv), elements);
}

void attention_chunk_vs_decode(int device, const AttentionCheckShape& s, int start, int chunk, bool gathered,
                               const float* q_gate, const float* k, const float* v, const float* q_norm,
                               const float* k_norm, const float* rope_cos, const float* rope_sin,
                               const int* page_order, int n_pages, const QsaCheckInputs& qsa,
                               const ChunkCheckOutputs& stepwise, const ChunkCheckOutputs& at_once) {
  const int tokens = start + chunk;
  STRATA_EXPECTS(start >= 0 && chunk > 0 && s.page_size > 0 && n_pages * s.page_size >= tokens, InvalidArgument,
                 "attention_chunk_vs_decode: " + std::to_string(n_pages) + " pages of " +
                     std::to_string(s.page_size) + " tokens cannot hold " + std::to_string(start) + " + " +
                     std::to_string(chunk) + " tokens");
  for (int i = 0; i < n_pages; ++i)
    STRATA_EXPECTS(page_order[i] >= 0 && page_order[i] < n_pages, InvalidArgument,
                   "attention_chunk_vs_decode: page_order[" + std::to_string(i) + "] = " +
                       std::to_string(page_order[i]) + " outside [0, " + std::to_string(n_pages) + ")");
  support::check_device(device);
  DeviceScope scope(device);
  const int d = s.head_dim, half = s.rope_dim / 2;
  const kernels::AttentionShape shape{s.n_head, s.n_head_kv, d, s.rope_dim, s.eps};
  STRATA_EXPECTS(kernels::attention_decode_fits(shape) && kernels::attention_chunk_fits(shape), InvalidArgument,
                 "attention_chunk_vs_decode: the decode or chunk kernel does not take " + std::to_string(s.n_head) +
                     " q heads over " + std::to_string(s.n_head_kv) + " kv heads of " + std::to_string(d));
  const bool use_qsa = qsa.q != nullptr;
  const int di = use_qsa ? qsa.head_dim : 0, r = qsa.ratio, keep = use_qsa ? qsa.keep_blocks : 0;
  const int max_blocks = tokens / r + 1;
  const std::size_t qg = static_cast<std::size_t>(s.n_head) * 2 * d, hd = static_cast<std::size_t>(s.n_head) * d;
  const std::size_t kvd = static_cast<std::size_t>(s.n_head_kv) * d;
  const std::size_t iq = use_qsa ? static_cast<std::size_t>(qsa.n_heads) * di : 0;
  const std::size_t elements = static_cast<std::size_t>(n_pages) * s.n_head_kv * s.page_size * d;
  const std::size_t raw_bytes = use_qsa ? static_cast<std::size_t>(max_blocks) * r * di * sizeof(float) : 0;
  const std::size_t block_bytes = use_qsa ? static_cast<std::size_t>(max_blocks) * di * sizeof(float) : 0;
  const std::size_t key_bytes = chunk_cache_bytes(s, n_pages, false), value_bytes = chunk_cache_bytes(s, n_pages, true);
  PathState stepwise_state(key_bytes, value_bytes, raw_bytes, block_bytes);
  PathState chunk_state(key_bytes, value_bytes, raw_bytes, block_bytes);
  const auto paged = [&](const PathState& state, const DeviceBuffer& table) {
    return kernels::PagedKv{kernels::kv_half(kv_key_codes(s.kv), state.keys.data<void>(), elements),
                            kernels::kv_half(kv_value_codes(s.kv), state.values.data<void>(), elements),
                            s.n_head_kv, d, s.page_size, n_pages, table.as<int>()};
  };
  const auto indexer = [](const PathState& state) {
    return kernels::IndexerCache{state.raw_keys.data<float>(), state.block_keys.data<float>()};
  };
  DeviceBuffer table = upload(page_order, n_pages * sizeof(int));
  DeviceBuffer cos = upload(rope_cos, static_cast<std::size_t>(tokens) * half * sizeof(float));
  DeviceBuffer sin = upload(rope_sin, static_cast<std::size_t>(tokens) * half * sizeof(float));
  DeviceBuffer d_qn = upload(q_norm, d * sizeof(float)), d_kn = upload(k_norm, d * sizeof(float));
  DeviceBuffer d_iqn = use_qsa ? upload(qsa.q_norm, di * sizeof(float)) : DeviceBuffer(0);
  DeviceBuffer d_ikn = use_qsa ? upload(qsa.k_norm, di * sizeof(float)) : DeviceBuffer(0);
  const kernels::IndexerShape ishape{qsa.n_heads, di, r, keep, s.rope_dim, max_blocks, s.eps};

  // (a) token by token, the session's decode order.
  DeviceBuffer d_qg(qg * sizeof(float)), d_k(kvd * sizeof(float)), d_v(kvd * sizeof(float)), d_pos(sizeof(int));
  DeviceBuffer d_iq(iq * sizeof(float)), d_kraw(di * sizeof(float));
  GuardedOutput d_q(hd * sizeof(float)), d_out(hd * sizeof(float));
  GuardedOutput d_selected(keep * sizeof(int)), d_count(sizeof(int));
  DeviceBuffer scores(max_blocks * sizeof(float));
  DeviceBuffer partials(kernels::attention_decode_partial_floats(shape) * sizeof(float));
  const kernels::PagedKv kv_a = paged(stepwise_state, table);
  const kernels::AttentionPrepArgs prep{d_qg.as<float>(), d_k.as<float>(), d_v.as<float>(), d_qn.as<float>(),
                                        d_kn.as<float>(), cos.as<float>(), sin.as<float>(), d_pos.as<int>(),
                                        d_q.data<float>()};
  kernels::AttentionDecodeArgs step;
  step.q = d_q.data<float>();
  step.q_gate = d_qg.as<float>();
  step.position = d_pos.as<int>();
  step.block_tokens = r;
  step.out = d_out.data<float>();
  kernels::carve_attention_partials(shape, partials.as<float>(), step);
  const kernels::IndexerSelectArgs select{d_iq.as<float>(), d_iqn.as<float>(), cos.as<float>(), sin.as<float>(),
                                          d_pos.as<int>(), scores.as<float>(), d_selected.data<int>(),
                                          d_count.data<int>()};
  if (use_qsa) {
    step.selected_blocks = d_selected.data<int>();
    step.n_selected = d_count.data<int>();
  }
  std::vector<int> blocks(keep);
  for (int t = 0; t < tokens; ++t) {
    if (t == start) chunk_state.copy_from(stepwise_state);
    copy_in(d_pos, &t, sizeof(int));
    copy_in(d_qg, q_gate + t * qg, qg * sizeof(float));
    copy_in(d_k, k + t * kvd, kvd * sizeof(float));
    copy_in(d_v, v + t * kvd, kvd * sizeof(float));
    launched(kernels::attention_prep(shape, prep, kv_a, nullptr), "attention_prep");
    if (use_qsa) {
      copy_in(d_iq, qsa.q + t * iq, iq * sizeof(float));
      copy_in(d_kraw, qsa.kraw + t * di, di * sizeof(float));
      launched(kernels::qsa_append(ishape, indexer(stepwise_state), d_kraw.as<float>(), d_ikn.as<float>(),
                                   cos.as<float>(), sin.as<float>(), d_pos.as<int>(), nullptr),
               "qsa_append");
      launched(kernels::qsa_select(ishape, indexer(stepwise_state), select, nullptr), "qsa_select");
    }
    launched(kernels::attention_decode(shape, step, kv_a, nullptr), "attention_decode");
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
    if (t < start) continue;
    const int row = t - start;
    d_out.copy_out(stepwise.out + row * hd, "attention_decode");
    d_q.copy_out(stepwise.q + row * hd, "attention_prep");
    if (!use_qsa) continue;
    d_count.copy_out(stepwise.n_selected + row, "qsa_select (count)");
    d_selected.copy_out(blocks.data(), "qsa_select (blocks)");
    int* selected = stepwise.selected + static_cast<std::size_t>(row) * keep;
    pad_selection(blocks.data(), stepwise.n_selected[row], keep, selected);
  }
  read_state(stepwise_state, s, elements, tokens, page_order, use_qsa, stepwise);

  // (b) the chunk at once, from fused rows [q_gate | k | v | indexer q | indexer k | pad]; the pad is NaN, so
  // a kernel that strays from its slice poisons its output.
  const std::size_t width = qg + 2 * kvd + iq + di + 3;
  std::vector<float> fused(chunk * width, std::numeric_limits<float>::quiet_NaN());
  for (int t = 0; t < chunk; ++t) {
    float* row = fused.data() + t * width;
    const std::size_t from = start + t;
    std::copy(q_gate + from * qg, q_gate + (from + 1) * qg, row);
    std::copy(k + from * kvd, k + (from + 1) * kvd, row + qg);
    std::copy(v + from * kvd, v + (from + 1) * kvd, row + qg + kvd);
    if (!use_qsa) continue;
    std::copy(qsa.q + from * iq, qsa.q + (from + 1) * iq, row + qg + 2 * kvd);
    std::copy(qsa.kraw + from * di, qsa.kraw + (from + 1) * di, row + qg + 2 * kvd + iq);
  }
  std::vector<int> positions(chunk);
  for (int t = 0; t < chunk; ++t) positions[t] = start + t;
  DeviceBuffer d_fused = upload(fused.data(), fused.size() * sizeof(float));
  DeviceBuffer d_positions = upload(positions.data(), chunk * sizeof(int));
  GuardedOutput c_q(chunk * hd * sizeof(float)), c_out(chunk * hd * sizeof(float));
  GuardedOutput c_selected(static_cast<std::size_t>(chunk) * keep * sizeof(int)), c_count(chunk * sizeof(int));
  DeviceBuffer scratch(kernels::qsa_select_chunk_scratch_floats(ishape, chunk) * sizeof(float));
  // Poisoned: a span's partial the kernel leaves unwritten reads as NaN in the merge.
  const std::size_t span_bytes = kernels::attention_chunk_scratch_floats(shape, chunk) * sizeof(float);
  GuardedOutput spans(span_bytes);
  const float* rows = d_fused.as<float>();
  const long stride = static_cast<long>(width);
  const kernels::PagedKv kv_b = paged(chunk_state, table);
  kernels::AttentionChunkPrepArgs chunk_prep;
  chunk_prep.q_gate = rows;
  chunk_prep.k = rows + qg;
  chunk_prep.v = rows + qg + kvd;
  chunk_prep.q_gate_stride = chunk_prep.k_stride = chunk_prep.v_stride = stride;
  chunk_prep.q_norm = d_qn.as<float>();
  chunk_prep.k_norm = d_kn.as<float>();
  chunk_prep.rope_cos = cos.as<float>();
  chunk_prep.rope_sin = sin.as<float>();
  chunk_prep.positions = d_positions.as<int>();
  chunk_prep.q_out = c_q.data<float>();
  kernels::AttentionChunkArgs attend;
  attend.q = c_q.data<float>();
  attend.q_gate = rows;
  attend.q_gate_stride = stride;
  attend.positions = d_positions.as<int>();
  attend.block_tokens = r;
  attend.gathered = gathered;
  attend.scratch = spans.data<float>();
  attend.out = c_out.data<float>();
  kernels::IndexerSelectChunkArgs chunk_select;
  chunk_select.q = rows + qg + 2 * kvd;
  chunk_select.q_stride = stride;
  chunk_select.q_norm = d_iqn.as<float>();
  chunk_select.rope_cos = cos.as<float>();
  chunk_select.rope_sin = sin.as<float>();
  chunk_select.positions = d_positions.as<int>();
  chunk_select.scratch = scratch.as<float>();
  chunk_select.selected_blocks = c_selected.data<int>();
  chunk_select.n_selected = c_count.data<int>();
  if (use_qsa) {
    attend.selected_blocks = c_selected.data<int>();
    attend.n_selected = c_count.data<int>();
    attend.selection_stride = keep;
  }
  // Captured into a graph, as the prompt program will run them: the positions are read from device memory.
  Stream stream;
  const CapturedGraph graph(stream.get(), [&](cudaStream_t on) {
    launched(kernels::attention_prep_chunk(shape, chunk_prep, chunk, kv_b, on), "attention_prep_chunk");
    if (use_qsa) {
      launched(kernels::qsa_append_chunk(ishape, indexer(chunk_state), rows + qg + 2 * kvd + iq, stride, chunk,
                                         d_ikn.as<float>(), cos.as<float>(), sin.as<float>(), d_positions.as<int>(),
                                         on),
               "qsa_append_chunk");
      launched(kernels::qsa_select_chunk(ishape, indexer(chunk_state), chunk_select, chunk, on), "qsa_select_chunk");
    }
    launched(kernels::attention_chunk(shape, attend, chunk, kv_b, on), "attention_chunk");
  });
  graph.launch(stream.get());
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  c_out.copy_out(at_once.out, "attention_chunk");
  if (span_bytes > 0) {  // the partials stayed inside the scratch sized for either mode
    std::vector<unsigned char> partials(span_bytes);
    spans.copy_out(partials.data(), "attention_chunk (span partials)");
  }
  c_q.copy_out(at_once.q, "attention_prep_chunk");
  read_state(chunk_state, s, elements, tokens, page_order, use_qsa, at_once);
  if (!use_qsa) return;
  c_count.copy_out(at_once.n_selected, "qsa_select_chunk (counts)");
  std::vector<int> chosen(static_cast<std::size_t>(chunk) * keep);
  c_selected.copy_out(chosen.data(), "qsa_select_chunk (blocks)");
  for (int t = 0; t < chunk; ++t) {
    const std::size_t at = static_cast<std::size_t>(t) * keep;
    pad_selection(chosen.data() + at, at_once.n_selected[t], keep, at_once.selected + at);
  }
}

}  // namespace strata::kernel_check
