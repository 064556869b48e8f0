// Token sampling on the device, exactly as strata.sampling (src/strata/sampling.py) defines it: repetition
// penalty on the seen ids, then greedy (temperature 0) or temperature, top-k, top-p, min-p and one draw from a
// uniform u. Every per-token value (the parameters, u, the seen ids and their count) is read from device
// memory, so one captured CUDA graph serves every token. Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels {

// The largest vocabulary sample_token accepts (the draw runs in one CTA).
constexpr int kMaxSampleVocab = 262144;

// One token's sampling values, in device memory. Types follow the reference: its float64 arithmetic
// (temperature, top-p, min-p, the draw) stays double; the penalty acts on float32 logits, so it is a float.
struct SampleParams {
  double temperature = 0.0;     // 0 = greedy
  double top_p = 1.0;           // (0, 1]; 1 = off
  double min_p = 0.0;           // [0, 1); 0 = off
  double u = 0.0;               // the uniform draw in [0, 1)
  float repeat_penalty = 1.0f;  // > 0; 1 = off
  int top_k = 0;                // 0 (or >= vocab) = off
  int n_seen = 0;               // ids of seen_ids the penalty uses (clamped to the launcher's max_seen)
};

// Whether `p` picks the argmax whatever u is: greedy (temperature 0), or top-k 1 (its one candidate has
// probability 1, every filter keeps it and every draw lands on it). sample_argmax's case.
__host__ __device__ inline bool picks_argmax(const SampleParams& p) { return p.temperature == 0.0 || p.top_k == 1; }

// Bytes of the scratch buffer sample_token (and sample_argmax) needs for `vocab` logits (the sorted keys and the sort's
// workspace). A host-side size query: it launches nothing.
cudaError_t sample_scratch_bytes(int vocab, std::size_t* bytes);

// *token = the id strata.sampling.sample(logits, params, params.u, seen_ids[:n_seen]) returns.
// logits [vocab] float32 (finite: the reference refuses NaN and infinity, here they give an unspecified id);
// seen_ids [max_seen] (may repeat; ids outside [0, vocab) are skipped); scratch of sample_scratch_bytes(vocab)
// bytes, 256-byte aligned.
cudaError_t sample_token(const float* logits, int vocab, const int* seen_ids, int max_seen,
                         const SampleParams* params, void* scratch, std::size_t scratch_bytes, int* token,
                         cudaStream_t stream);

// sample_token where picks_argmax(*params) (the host knows: it wrote the values): the same *token, the largest
// penalised logit with the lowest id among ties (-0 and +0 alike), without the sort (a reduction over the
// keys). Reads only the penalty's values of *params; the same arguments and scratch as sample_token.
cudaError_t sample_argmax(const float* logits, int vocab, const int* seen_ids, int max_seen,
                          const SampleParams* params, void* scratch, std::size_t scratch_bytes, int* token,
                          cudaStream_t stream);

}  // namespace strata::kernels
