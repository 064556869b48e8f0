// kernel_check round trips of the GDN and attention (+ QSA) decode kernels and of the KV rotation. The attention
// check runs the kernels as the session will: captured once into a CUDA graph, replayed per token after the
// per-token values (position, projections) are rewritten in fixed device buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../kernels/attention.cuh"
#include "../kernels/gdn.cuh"
#include "../kernels/kv_rotation.cuh"
#include "../kernels/ple.cuh"
#include "../kernels/qsa.cuh"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "kernel_check_support.hpp"
#include "kv_readback.hpp"
#include "strata/check/kernel_check_mixers.hpp"

namespace strata::kernel_check {
namespace {

using support::GuardedOutput;
using support::read_cache;
using support::upload;

void copy_in(DeviceBuffer& dst, const void* host, std::size_t bytes) {
  STRATA_CUDA_TRY(cudaMemcpy(dst.as<void>(), host, bytes, cudaMemcpyHostToDevice));
}

cudaError_t first_error(std::initializer_list<cudaError_t> errors) {
  for (cudaError_t e : errors)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace

void gdn_steps(int device, const GdnCheckShape& s, int steps, const float* qkv, const float* z,
               const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
               const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* out,
               const Q8Host& out_q8) {
  kernels::GdnShape shape{s.n_k_heads, s.n_v_heads, s.head_k_dim, s.head_v_dim, s.conv_kernel,
                          s.tiled_heads, s.interleaved_ba, s.sigmoid_gate, s.eps};
  STRATA_EXPECTS(steps > 0 && shape.n_k_heads > 0 && shape.n_v_heads % shape.n_k_heads == 0, InvalidArgument,
                 "gdn_steps: need steps > 0 and n_v_heads a multiple of n_k_heads, got steps=" +
                     std::to_string(steps) + ", heads " + std::to_string(s.n_v_heads) + "/" +
                     std::to_string(s.n_k_heads));
  support::check_q8_unit(out_q8, static_cast<long>(s.n_v_heads) * s.head_v_dim, "gdn_steps", "Hv * dv");
  support::check_device(device);
  DeviceScope scope(device);
  const std::size_t c = shape.conv_channels(), hv = s.n_v_heads, vd = hv * s.head_v_dim;
  const std::size_t ba = s.interleaved_ba ? 2 * hv : hv;
  const std::size_t conv_bytes = (s.conv_kernel - 1) * c * sizeof(float);
  const std::size_t state_bytes = hv * s.head_k_dim * s.head_v_dim * sizeof(float);
  DeviceBuffer d_weight = upload(conv_weight, c * s.conv_kernel * sizeof(float));
  DeviceBuffer d_a = upload(ssm_a, hv * sizeof(float)), d_dt = upload(dt_bias, hv * sizeof(float));
  DeviceBuffer d_norm = upload(norm_weight, s.head_v_dim * sizeof(float));
  GuardedOutput d_conv_state(conv_bytes), d_state(state_bytes), d_conv_out(c * sizeof(float)),
      d_out(vd * sizeof(float));
  STRATA_CUDA_TRY(cudaMemcpy(d_conv_state.data<void>(), conv_state, conv_bytes, cudaMemcpyHostToDevice));
  STRATA_CUDA_TRY(cudaMemcpy(d_state.data<void>(), state, state_bytes, cudaMemcpyHostToDevice));
  DeviceBuffer d_qkv(c * sizeof(float)), d_z(vd * sizeof(float)), d_b(ba * sizeof(float)), d_alpha(hv * sizeof(float));
  kernels::GdnStepArgs args{d_qkv.as<float>(), d_z.as<float>(), d_b.as<float>(), d_alpha.as<float>(),
                            d_weight.as<float>(), d_a.as<float>(), d_dt.as<float>(), d_norm.as<float>(),
                            d_conv_state.data<float>(), d_state.data<float>(), d_conv_out.data<float>(),
                            d_out.data<float>()};
  const support::GuardedQ8 q8(out_q8, static_cast<long>(vd));
  args.out_q8 = q8.blocks();
  for (int t = 0; t < steps; ++t) {
    copy_in(d_qkv, qkv + t * c, c * sizeof(float));
    copy_in(d_z, z + t * vd, vd * sizeof(float));
    copy_in(d_b, beta_in + t * ba, ba * sizeof(float));
    if (!s.interleaved_ba) copy_in(d_alpha, alpha_in + t * hv, hv * sizeof(float));
    STRATA_EXPECTS(kernels::gdn_step(shape, args, nullptr) == cudaSuccess, InvalidArgument,
                   "gdn_step refused the shape (conv_kernel must be 2..8)");
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
    d_out.copy_out(out + t * vd, "gdn_step");
    q8.copy_out(t, "gdn_step (q8_32)");
  }
  d_conv_state.copy_out(conv_state, "gdn_step (conv state)");
  d_state.copy_out(state, "gdn_step (recurrent state)");
}

void ple_steps(int device, int streams, int width, int dilation, int conv_kernel, float eps, int steps, bool chunk,
               const float* stream_rows, const float* key, const float* value, const float* norm_key,
               const float* norm_query, const float* norm_conv, const float* conv_weight, float* history, float* out,
               float* history_rows) {
  const kernels::PleShape shape{streams, width, dilation, conv_kernel, eps};
  STRATA_EXPECTS(!history_rows || chunk, InvalidArgument, "ple_steps: row states come from ple_chunk");
  STRATA_EXPECTS(steps > 0 && streams > 0 && width > 0 && dilation > 0 && conv_kernel >= 2 && conv_kernel <= 8,
                 InvalidArgument,
                 "ple_steps: need steps, streams, width, dilation > 0 and conv_kernel in 2..8, got steps=" +
                     std::to_string(steps) + " hc=" + std::to_string(streams) + " n=" + std::to_string(width) +
                     " dilation=" + std::to_string(dilation) + " K=" + std::to_string(conv_kernel));
  support::check_device(device);
  DeviceScope scope(device);
  const std::size_t c = static_cast<std::size_t>(streams) * width, f = sizeof(float);
  const std::size_t history_bytes = static_cast<std::size_t>(shape.history_rows()) * c * f;
  DeviceBuffer d_nk = upload(norm_key, c * f), d_nq = upload(norm_query, c * f), d_nc = upload(norm_conv, c * f);
  DeviceBuffer d_w = upload(conv_weight, c * conv_kernel * f);
  DeviceBuffer d_streams = upload(stream_rows, steps * c * f), d_key = upload(key, steps * c * f);
  DeviceBuffer d_value = upload(value, static_cast<std::size_t>(steps) * width * f);
  GuardedOutput d_history(history_bytes), d_out(steps * c * f);
  STRATA_CUDA_TRY(cudaMemcpy(d_history.data<void>(), history, history_bytes, cudaMemcpyHostToDevice));
  kernels::PleStepArgs args{d_streams.as<float>(), d_key.as<float>(), d_value.as<float>(), d_nk.as<float>(),
                            d_nq.as<float>(), d_nc.as<float>(), d_w.as<float>(), d_history.data<float>(),
                            d_out.data<float>()};
  GuardedOutput d_rows(history_rows ? steps * history_bytes : 0);
  if (history_rows) {
    args.history_rows = d_rows.data<float>();
    args.row_stride = static_cast<long>(history_bytes / f);
  }
  if (chunk) {
    STRATA_CUDA_TRY(kernels::ple_chunk(shape, args, steps, nullptr));
  } else {
    for (int t = 0; t < steps; ++t) {  // args move on to each token's rows, as a decode step's buffers hold them
      STRATA_CUDA_TRY(kernels::ple_step(shape, args, nullptr));
      args.streams += c;
      args.key += c;
      args.value += width;
      args.out += c;
    }
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, chunk ? "ple_chunk" : "ple_step");
  d_history.copy_out(history, chunk ? "ple_chunk (history)" : "ple_step (history)");
  if (history_rows) d_rows.copy_out(history_rows, "ple_chunk (history rows)");
}

void attention_steps(int device, const AttentionCheckShape& s, int steps, const float* q_gate, const float* k,
                     const float* v, const float* q_norm, const float* k_norm, const float* rope_cos,
                     const float* rope_sin, const int* page_order, int n_pages, const QsaCheckInputs& qsa,
                     const QsaCheckOutputs& qsa_out, float* out, float* q_out, float* k_cache, float* v_cache,
                     const Q8Host& out_q8) {
  STRATA_EXPECTS(steps > 0 && s.page_size > 0 && n_pages * s.page_size >= steps, InvalidArgument,
                 "attention_steps: " + std::to_string(n_pages) + " pages of " + std::to_string(s.page_size) +
                     " tokens cannot hold " + std::to_string(steps) + " steps");
  for (int i = 0; i < n_pages; ++i)
    STRATA_EXPECTS(page_order[i] >= 0 && page_order[i] < n_pages, InvalidArgument,
                   "attention_steps: page_order[" + std::to_string(i) + "] = " + std::to_string(page_order[i]) +
                       " outside [0, " + std::to_string(n_pages) + ")");
  support::check_device(device);
  DeviceScope scope(device);
  const int d = s.head_dim, half = s.rope_dim / 2;
  const std::size_t qg = static_cast<std::size_t>(s.n_head) * 2 * d, hd = static_cast<std::size_t>(s.n_head) * d;
  const std::size_t kvd = static_cast<std::size_t>(s.n_head_kv) * d;
  const std::size_t elements = static_cast<std::size_t>(n_pages) * s.n_head_kv * s.page_size * d;
  const KvCodes key_codes = kv_key_codes(s.kv), value_codes = kv_value_codes(s.kv);
  GuardedOutput keys(kv_half_bytes(key_codes, elements)), values(kv_half_bytes(value_codes, elements));
  DeviceBuffer table = upload(page_order, n_pages * sizeof(int));
  DeviceBuffer cos = upload(rope_cos, static_cast<std::size_t>(steps) * half * sizeof(float));
  DeviceBuffer sin = upload(rope_sin, static_cast<std::size_t>(steps) * half * sizeof(float));
  DeviceBuffer d_qn = upload(q_norm, d * sizeof(float)), d_kn = upload(k_norm, d * sizeof(float));
  DeviceBuffer d_qg(qg * sizeof(float)), d_k(kvd * sizeof(float)), d_v(kvd * sizeof(float)), d_pos(sizeof(int));
  GuardedOutput d_q(hd * sizeof(float)), d_out(hd * sizeof(float));
  kernels::PagedKv kv{kernels::kv_half(key_codes, keys.data<void>(), elements),
                      kernels::kv_half(value_codes, values.data<void>(), elements), s.n_head_kv, d, s.page_size,
                      n_pages, table.as<int>()};
  kernels::AttentionShape shape{s.n_head, s.n_head_kv, d, s.rope_dim, s.eps};
  kernels::AttentionPrepArgs prep{d_qg.as<float>(), d_k.as<float>(), d_v.as<float>(), d_qn.as<float>(),
                                  d_kn.as<float>(), cos.as<float>(), sin.as<float>(), d_pos.as<int>(), d_q.data<float>()};
  STRATA_EXPECTS(kernels::attention_decode_fits(shape), InvalidArgument,
                 "attention_steps: the decode kernel does not take this many q heads per kv head of this head_dim");
  DeviceBuffer partials(kernels::attention_decode_partial_floats(shape) * sizeof(float));
  kernels::AttentionDecodeArgs decode;
  decode.q = d_q.data<float>();
  decode.q_gate = d_qg.as<float>();
  decode.position = d_pos.as<int>();
  decode.block_tokens = qsa.ratio;
  decode.out = d_out.data<float>();
  const support::GuardedQ8 q8(out_q8, static_cast<long>(hd));  // head_dim is whole blocks (valid_attention)
  decode.out_q8 = q8.blocks();
  kernels::carve_attention_partials(shape, partials.as<float>(), decode);

  // QSA buffers (empty when disabled).
  const bool use_qsa = qsa.q != nullptr;
  const int di = qsa.head_dim, r = qsa.ratio, max_blocks = steps / r + 1;
  const std::size_t iq = static_cast<std::size_t>(qsa.n_heads) * di;
  kernels::IndexerShape ishape{qsa.n_heads, di, r, qsa.keep_blocks, s.rope_dim, max_blocks, s.eps};
  DeviceBuffer d_iq(use_qsa ? iq * sizeof(float) : 0), d_kraw(use_qsa ? di * sizeof(float) : 0);
  DeviceBuffer d_iqn = use_qsa ? upload(qsa.q_norm, di * sizeof(float)) : DeviceBuffer(0);
  DeviceBuffer d_ikn = use_qsa ? upload(qsa.k_norm, di * sizeof(float)) : DeviceBuffer(0);
  GuardedOutput raw_keys(use_qsa ? max_blocks * r * di * sizeof(float) : 0),
      block_keys(use_qsa ? max_blocks * di * sizeof(float) : 0), scores(use_qsa ? max_blocks * sizeof(float) : 0),
      selected(use_qsa ? qsa.keep_blocks * sizeof(int) : 0), n_selected(sizeof(int));
  kernels::IndexerCache icache{raw_keys.data<float>(), block_keys.data<float>()};
  kernels::IndexerSelectArgs select{d_iq.as<float>(), d_iqn.as<float>(), cos.as<float>(), sin.as<float>(),
                                    d_pos.as<int>(), scores.data<float>(), selected.data<int>(), n_selected.data<int>()};
  if (use_qsa) {
    decode.selected_blocks = selected.data<int>();
    decode.n_selected = n_selected.data<int>();
  }

  Stream stream;
  const CapturedGraph graph(stream.get(), [&](cudaStream_t s) {
    cudaError_t launched = kernels::attention_prep(shape, prep, kv, s);
    if (use_qsa)
      launched = first_error({launched,
                              kernels::qsa_append(ishape, icache, d_kraw.as<float>(), d_ikn.as<float>(),
                                                  cos.as<float>(), sin.as<float>(), d_pos.as<int>(), s),
                              kernels::qsa_select(ishape, icache, select, s)});
    launched = first_error({launched, kernels::attention_decode(shape, decode, kv, s)});
    STRATA_EXPECTS(launched == cudaSuccess, InvalidArgument,
                   std::string("attention_steps: a launcher refused its arguments (") + cudaGetErrorName(launched) +
                       ")");
  });

  const int nb_max = steps / r;
  std::vector<float> step_scores(max_blocks);
  std::vector<int> step_selected(use_qsa ? qsa.keep_blocks : 0);
  for (int t = 0; t < steps; ++t) {
    copy_in(d_pos, &t, sizeof(int));
    copy_in(d_qg, q_gate + t * qg, qg * sizeof(float));
    copy_in(d_k, k + t * kvd, kvd * sizeof(float));
    copy_in(d_v, v + t * kvd, kvd * sizeof(float));
    if (use_qsa) {
      copy_in(d_iq, qsa.q + t * iq, iq * sizeof(float));
      copy_in(d_kraw, qsa.kraw + t * di, di * sizeof(float));
    }
    graph.launch(stream.get());
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    d_out.copy_out(out + t * hd, "attention_decode");
    q8.copy_out(t, "attention_decode (q8_32)");
    d_q.copy_out(q_out + t * hd, "attention_prep");
    if (!use_qsa) continue;
    int count = 0;
    n_selected.copy_out(&count, "qsa_select (count)");
    scores.copy_out(step_scores.data(), "qsa_select (scores)");
    selected.copy_out(step_selected.data(), "qsa_select (blocks)");
    const int nb = (t + 1) / r;
    for (int b = 0; b < nb_max; ++b)
      qsa_out.scores[t * nb_max + b] = b < nb ? step_scores[b] : std::numeric_limits<float>::quiet_NaN();
    for (int b = 0; b < qsa.keep_blocks; ++b)
      qsa_out.selected[t * qsa.keep_blocks + b] = b < count ? step_selected[b] : -1;
    qsa_out.n_selected[t] = count;
  }
  read_cache(keys, key_codes, elements, s, steps, page_order, k_cache, "k cache");
  read_cache(values, value_codes, elements, s, steps, page_order, v_cache, "v cache");
}

void kv_rotate_rows(int device, int rows, int head_dim, const float* in, float* out) {
  STRATA_EXPECTS(rows > 0 && head_dim > 0 && head_dim % kKvGroup == 0, InvalidArgument,
                 "kv_rotate_rows: need rows > 0 and head_dim a positive multiple of 32, got " + std::to_string(rows) +
                     " x " + std::to_string(head_dim));
  support::check_device(device);
  DeviceScope scope(device);
  const std::size_t bytes = static_cast<std::size_t>(rows) * head_dim * sizeof(float);
  DeviceBuffer d_in = upload(in, bytes);
  GuardedOutput d_out(bytes);
  STRATA_CUDA_TRY(kernels::kv_rotate(d_in.as<float>(), d_out.data<float>(), rows, head_dim, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  d_out.copy_out(out, "kv_rotate");
}

int qsa_top_blocks(int device, const float* scores, int n_blocks, int keep_blocks, int* selected) {
  STRATA_EXPECTS(n_blocks > 0 && keep_blocks > 0, InvalidArgument,
                 "qsa_top_blocks: need n_blocks > 0 and keep_blocks > 0, got " + std::to_string(n_blocks) + ", " +
                     std::to_string(keep_blocks));
  support::check_device(device);
  DeviceScope scope(device);
  kernels::IndexerShape shape{1, 32, 4, keep_blocks, 0, n_blocks, 1e-6f};
  DeviceBuffer d_scores = upload(scores, n_blocks * sizeof(float));
  const int position = n_blocks * 4 - 1;
  DeviceBuffer d_pos = upload(&position, sizeof(int));
  GuardedOutput d_selected(keep_blocks * sizeof(int)), d_count(sizeof(int));
  kernels::IndexerSelectArgs args{};
  args.position = d_pos.as<int>();
  args.scores = d_scores.as<float>();
  args.selected_blocks = d_selected.data<int>();
  args.n_selected = d_count.data<int>();
  STRATA_CUDA_TRY(kernels::qsa_top_blocks(shape, args, nullptr));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  int count = 0;
  d_count.copy_out(&count, "qsa_top_blocks (count)");
  std::vector<int> chosen(keep_blocks);
  d_selected.copy_out(chosen.data(), "qsa_top_blocks");
  for (int b = 0; b < keep_blocks; ++b) selected[b] = b < count ? chosen[b] : -1;
  return count;
}

}  // namespace strata::kernel_check
