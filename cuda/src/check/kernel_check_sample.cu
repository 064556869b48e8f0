// kernel_check entry of the token sampler: arguments checked as strata.sampling checks them, then one launch
// per draw with every per-token value rewritten in device memory (optionally through one captured graph).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/sample.cuh"
#include "../runtime/pinned_memory.hpp"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

// The checks of strata.sampling.SamplingParams and sample(), with the same wording.
void check_sampling_values(double temperature, int top_k, double top_p, double min_p, double repeat_penalty,
                           const double* draws, int n_draws) {
  const bool finite = std::isfinite(temperature) && std::isfinite(top_p) && std::isfinite(min_p) &&
                      std::isfinite(repeat_penalty);
  STRATA_EXPECTS(finite, InvalidArgument, "sample_tokens: sampling parameters must be finite");
  STRATA_EXPECTS(temperature >= 0.0, InvalidArgument,
                 "sample_tokens: temperature must be >= 0 (0 = greedy), got " + std::to_string(temperature));
  STRATA_EXPECTS(top_k >= 0, InvalidArgument, "sample_tokens: top_k must be >= 0 (0 = off), got " +
                                                  std::to_string(top_k));
  STRATA_EXPECTS(top_p > 0.0 && top_p <= 1.0, InvalidArgument,
                 "sample_tokens: top_p must be in (0, 1], got " + std::to_string(top_p));
  STRATA_EXPECTS(min_p >= 0.0 && min_p < 1.0, InvalidArgument,
                 "sample_tokens: min_p must be in [0, 1), got " + std::to_string(min_p));
  STRATA_EXPECTS(repeat_penalty > 0.0, InvalidArgument,
                 "sample_tokens: repeat_penalty must be > 0 (1 = off), got " + std::to_string(repeat_penalty));
  STRATA_EXPECTS(n_draws > 0, InvalidArgument,
                 "sample_tokens: needs at least one draw, got " + std::to_string(n_draws));
  for (int k = 0; k < n_draws; ++k)
    STRATA_EXPECTS(draws[k] >= 0.0 && draws[k] < 1.0, InvalidArgument,
                   "sample_tokens: the uniform draw must be in [0, 1), got " + std::to_string(draws[k]) +
                       " (draw " + std::to_string(k) + ")");
}

// Seen ids must index the logits, and the logits after the penalty must be finite (the reference refuses
// NaN and infinity; the kernel would return an unspecified id).
void check_logits_and_seen(const float* logits, int vocab, const std::int32_t* seen, int n_seen,
                           double repeat_penalty) {
  STRATA_EXPECTS(vocab > 0 && vocab <= kernels::kMaxSampleVocab, InvalidArgument,
                 "sample_tokens: vocab must be in [1, " + std::to_string(kernels::kMaxSampleVocab) + "], got " +
                     std::to_string(vocab));
  STRATA_EXPECTS(n_seen >= 0, InvalidArgument, "sample_tokens: n_seen must be >= 0, got " + std::to_string(n_seen));
  for (int i = 0; i < vocab; ++i)
    STRATA_EXPECTS(std::isfinite(logits[i]), InvalidArgument,
                   "sample_tokens: logits contain NaN or infinity (index " + std::to_string(i) + ")");
  const float penalty = static_cast<float>(repeat_penalty);
  for (int k = 0; k < n_seen; ++k) {
    STRATA_EXPECTS(seen[k] >= 0 && seen[k] < vocab, InvalidArgument,
                   "sample_tokens: seen id " + std::to_string(seen[k]) + " (entry " + std::to_string(k) +
                       ") is outside the vocab [0, " + std::to_string(vocab) + ")");
    const float x = logits[seen[k]];
    STRATA_EXPECTS(std::isfinite(x > 0.0f ? x / penalty : x * penalty), InvalidArgument,
                   "sample_tokens: logits contain NaN or infinity after the repetition penalty (id " +
                       std::to_string(seen[k]) + ")");
  }
}

// The extras as strata.sampling checks them: finite values, a mask that allows some token of the logits.
void check_extras(const SampleExtras& extras, int vocab) {
  STRATA_EXPECTS(std::isfinite(extras.frequency_penalty) && std::isfinite(extras.presence_penalty) &&
                     extras.answer_start >= 0,
                 InvalidArgument, "sample_tokens: penalties must be finite and answer_start >= 0");
  for (int i = 0; extras.bias && i < vocab; ++i)
    STRATA_EXPECTS(std::isfinite(extras.bias[i]), InvalidArgument, "sample_tokens: the logit bias must be finite");
  if (!extras.mask) return;
  bool any = false;
  for (int i = 0; i < vocab && !any; ++i) any = (static_cast<std::uint32_t>(extras.mask[i / 32]) >> (i % 32)) & 1u;
  STRATA_EXPECTS(any, InvalidArgument, "the token mask allows no token of the logits");
}

}  // namespace

void sample_tokens(int device, const float* logits, int vocab, const std::int32_t* seen, int n_seen,
                   double temperature, int top_k, double top_p, double min_p, double repeat_penalty,
                   const SampleExtras& extras, const double* draws, int n_draws, bool graph, bool argmax_path,
                   std::int32_t* tokens) {
  check_sampling_values(temperature, top_k, top_p, min_p, repeat_penalty, draws, n_draws);
  STRATA_EXPECTS(!argmax_path || temperature == 0.0 || top_k == 1, InvalidArgument,
                 "sample_tokens: the argmax path needs temperature 0 or top_k 1, got temperature " +
                     std::to_string(temperature) + " and top_k " + std::to_string(top_k));
  check_logits_and_seen(logits, vocab, seen, n_seen, repeat_penalty);
  check_extras(extras, vocab);
  check_device(device);
  DeviceScope scope(device);
  std::size_t scratch_bytes = 0;
  STRATA_CUDA_TRY(kernels::sample_scratch_bytes(vocab, &scratch_bytes));
  DeviceBuffer d_logits = upload(logits, static_cast<std::size_t>(vocab) * sizeof(float));
  DeviceBuffer d_seen = n_seen > 0 ? upload(seen, static_cast<std::size_t>(n_seen) * sizeof(std::int32_t))
                                    : DeviceBuffer(0);
  DeviceBuffer d_params(sizeof(kernels::SampleParams));
  GuardedOutput d_scratch(scratch_bytes);  // guarded too: proves the sort and the kernels stay in their scratch
  GuardedOutput d_token(sizeof(std::int32_t));
  // The session's buffers: the bias in device memory, the mask's words mapped, the answer's counts zeroed once.
  const std::size_t vocab_bytes = static_cast<std::size_t>(vocab) * sizeof(float);
  DeviceBuffer d_bias = extras.bias ? upload(extras.bias, vocab_bytes) : DeviceBuffer(0);
  const int words = (vocab + 31) / 32;
  PinnedMapped mask(sizeof(std::int32_t) * words);
  if (extras.mask) std::memcpy(mask.host<void>(), extras.mask, sizeof(std::int32_t) * words);
  GuardedOutput d_counts(static_cast<std::size_t>(vocab) * sizeof(int));
  STRATA_CUDA_TRY(cudaMemset(d_counts.data<int>(), 0, static_cast<std::size_t>(vocab) * sizeof(int)));
  const kernels::SampleInputs inputs{mask.device<unsigned>(), d_bias.as<float>(), d_counts.data<int>()};
  Stream stream;
  auto* sample = argmax_path ? kernels::sample_argmax : kernels::sample_token;
  auto enqueue = [&](cudaStream_t s) {
    STRATA_CUDA_TRY(sample(d_logits.as<float>(), vocab, d_seen.as<int>(), n_seen, d_params.as<kernels::SampleParams>(),
                           inputs, d_scratch.data<void>(), scratch_bytes, d_token.data<int>(), s));
  };
  CapturedGraph captured;
  if (graph) captured = CapturedGraph(stream.get(), enqueue);
  STRATA_CUDA_TRY(cudaDeviceSynchronize());  // uploads and poisoning (legacy stream) done before the first run

  kernels::SampleParams params;
  params.temperature = temperature;
  params.top_p = top_p;
  params.min_p = min_p;
  params.repeat_penalty = static_cast<float>(repeat_penalty);
  params.top_k = top_k;
  params.n_seen = n_seen;
  params.frequency_penalty = extras.frequency_penalty;
  params.presence_penalty = extras.presence_penalty;
  params.answer_start = extras.answer_start;
  params.biased = extras.bias ? 1 : 0;
  params.masked = extras.mask ? 1 : 0;
  for (int k = 0; k < n_draws; ++k) {
    params.u = draws[k];
    // Ordered on the sampling stream; a pageable source is staged before the call returns.
    STRATA_CUDA_TRY(cudaMemcpyAsync(d_params.as<void>(), &params, sizeof(params), cudaMemcpyHostToDevice,
                                    stream.get()));
    if (graph)
      captured.launch(stream.get());
    else
      enqueue(stream.get());
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    d_token.copy_out(&tokens[k], "sample_token");
  }
  std::vector<unsigned char> scratch(scratch_bytes);
  d_scratch.copy_out(scratch.data(), "sample_token (scratch)");
  std::vector<int> counts(vocab);
  d_counts.copy_out(counts.data(), "sample_token (answer counts)");
  for (int i = 0; i < vocab; ++i)
    STRATA_EXPECTS(counts[i] == 0, Error, "sample_token left the answer's count of token " + std::to_string(i) +
                                              " at " + std::to_string(counts[i]) + ", not zero");
}

}  // namespace strata::kernel_check
