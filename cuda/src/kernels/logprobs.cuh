// Log-probabilities of one position on the device, as strata.sampling.log_probabilities defines them: the
// softmax of the raw logits in float64 (under a token mask, of the allowed tokens' only), the sampled token's value
// and the n most likely ids (ties to the lower id). Only these few numbers leave the device, never the vocabulary's
// logits. Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include "strata/logprobs.hpp"

namespace strata::kernels {

using strata::kMaxLogprobs;

struct Logprobs {
  double token = 0.0;              // log p(token)
  int ids[kMaxLogprobs] = {};      // the n most likely ids, most likely first
  double values[kMaxLogprobs] = {};
};

// *out for logits [vocab] (finite), the id `token` and n in [0, kMaxLogprobs]: one CTA reads the logits n + 2
// times (max and log-sum-exp, then one pass per alternative), which is cheap next to a token. `mask` (null: none):
// the token mask's words as sample.cuh's SampleInputs::mask; the caller keeps `token` allowed and n within the
// allowed count (an alternative past them is unspecified).
cudaError_t logprobs(const float* logits, int vocab, int token, int n, const unsigned* mask, Logprobs* out,
                     cudaStream_t stream);

}  // namespace strata::kernels
