// Token sampling on the device, exactly as strata.sampling (src/strata/sampling.py) defines it: logit bias,
// repetition penalty on the seen ids, frequency and presence penalties on the answer's ids, the token mask, then
// greedy (temperature 0) or temperature, top-k, top-p, min-p and one draw from a uniform u. Every per-token value
// (the parameters, u, the seen ids and their count, the mask's words, the bias) is read from memory at fixed
// addresses, so one captured CUDA graph serves every token; a draw without bias, penalties or mask reads only
// their flags. Launchers never allocate, synchronise or throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels {

// The largest vocabulary sample_token accepts (the draw runs in one CTA).
constexpr int kMaxSampleVocab = 262144;

// One token's sampling values, in device memory. Types follow the reference: its float64 arithmetic
// (temperature, top-p, min-p, the draw, count * frequency + presence) stays double; the repetition penalty acts
// on float32 logits, so it is a float.
struct SampleParams {
  double temperature = 0.0;        // 0 = greedy
  double top_p = 1.0;              // (0, 1]; 1 = off
  double min_p = 0.0;              // [0, 1); 0 = off
  double u = 0.0;                  // the uniform draw in [0, 1)
  double frequency_penalty = 0.0;  // subtracted per occurrence in the answer; 0 = off
  double presence_penalty = 0.0;   // subtracted once for a token in the answer; 0 = off
  float repeat_penalty = 1.0f;     // > 0; 1 = off
  int top_k = 0;                   // 0 (or >= vocab) = off
  int n_seen = 0;                  // ids of seen_ids the penalty uses (clamped to the launcher's max_seen)
  int answer_start = 0;            // seen_ids[answer_start:n_seen] are the answer's, which the two penalties count
  int biased = 0;                  // 1: SampleInputs::bias is added to the logits
  int masked = 0;                  // 1: only the tokens SampleInputs::mask allows are candidates
  // Where `masked`: 0, the mask's words were written before the launch; else this draw's ticket, which the host
  // publishes (SampleInputs::published) once it has written them: the sampler waits for it before it reads them, so
  // the host may compute the mask while the device runs the token's layers.
  unsigned mask_ticket = 0;
};

// Whether `p` sets the frequency or the presence penalty (the draw counts the answer's ids).
__host__ __device__ inline bool counts_answer(const SampleParams& p) {
  return p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
}

// Where the host publishes a mask it wrote after the launch (SampleParams::mask_ticket): words of mapped host memory,
// each on its own cache line. Tickets are compared for equality, so neither word needs resetting between draws.
struct MaskPublication {
  const unsigned* ready = nullptr;  // host -> device: the ticket of the last mask whose words are written
  unsigned* late = nullptr;         // device -> host: the ticket of a mask the sampler gave up waiting for
  long long timeout_ns = 0;         // how long the sampler waits for a ticket (the GPU's global timer)
};

// A session's buffers the sampler reads, each only where its SampleParams flag (or penalty) says so, so a draw
// without them reads nothing more; fixed for a captured graph's life, their contents written between draws.
struct SampleInputs {
  const unsigned* mask = nullptr;  // [(vocab + 31) / 32] words where `masked`: bit t % 32 of word t / 32 set where
                                   // token t is allowed (strata.sampling.TokenMask); may be mapped host memory
  const float* bias = nullptr;     // [vocab] where `biased`: added to each logit (0 for a token without a bias)
  int* counts = nullptr;           // [vocab] where counts_answer: all zero between draws (the owner zeroes it once);
                                   // a draw counts the answer's ids into it and clears them again
  MaskPublication published;       // where `mask_ticket` is set (none otherwise)
};

// Whether `p` picks the argmax whatever u is: greedy (temperature 0), or top-k 1 (its one candidate has
// probability 1, every filter keeps it and every draw lands on it). sample_argmax's case.
__host__ __device__ inline bool picks_argmax(const SampleParams& p) { return p.temperature == 0.0 || p.top_k == 1; }

// Bytes of the scratch buffer sample_token (and sample_argmax) needs for `vocab` logits (the sorted keys and the sort's
// workspace). A host-side size query: it launches nothing.
cudaError_t sample_scratch_bytes(int vocab, std::size_t* bytes);

// *token = the id strata.sampling.sample(logits, params, params.u, seen_ids[:n_seen]) returns, with the bias,
// answer counts and mask of `inputs` as SamplingParams' logit_bias, answer_start and token_mask.
// logits [vocab] float32 (finite: the reference refuses NaN and infinity, here they give an unspecified id);
// seen_ids [max_seen] (may repeat; ids outside [0, vocab) are skipped); scratch of sample_scratch_bytes(vocab)
// bytes, 256-byte aligned. A mask that allows no token gives an unspecified id: the host refuses it before. With a
// mask_ticket, a one-thread kernel before the first to read the mask waits for inputs.published.ready to equal it;
// a wait that gives up after published.timeout_ns writes the ticket into published.late and the draw reads the words
// as they are (its id unspecified): the host checks `late` after the draw.
cudaError_t sample_token(const float* logits, int vocab, const int* seen_ids, int max_seen,
                         const SampleParams* params, const SampleInputs& inputs, void* scratch,
                         std::size_t scratch_bytes, int* token, cudaStream_t stream);

// sample_token where picks_argmax(*params) (the host knows: it wrote the values): the same *token, the largest
// adjusted logit (bias, penalties) with the lowest id among ties (-0 and +0 alike) of those the mask allows,
// without the sort (a reduction over the keys). The same arguments and scratch as sample_token.
cudaError_t sample_argmax(const float* logits, int vocab, const int* seen_ids, int max_seen,
                          const SampleParams* params, const SampleInputs& inputs, void* scratch,
                          std::size_t scratch_bytes, int* token, cudaStream_t stream);

}  // namespace strata::kernels
