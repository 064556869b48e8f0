// What a session's sampler reads beside its stage values (kernels::SampleInputs, docs/structured.md "Where it
// runs"): the token mask's words, in page-locked memory mapped into the device, which the host writes in place
// before a draw; and the logit bias, kept dense on the device and copied there only when a draw's bias differs
// from the one it holds (a request's bias is the same for all its draws). The answer's counts for the frequency and
// presence penalties need no host part: the sampler counts the sequence's history on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../kernels/sample.cuh"
#include "../runtime/pinned_memory.hpp"
#include "programs/decode_program.hpp"
#include "strata/decode_session.hpp"

namespace strata {

class SamplerInputs {
 public:
  explicit SamplerInputs(int n_vocab);

  // The mask's words as the device reads them (ProgramIo::token_mask) and as the host writes them.
  const unsigned* mask_device() const noexcept { return mask_.device<unsigned>(); }
  std::int32_t* mask_words() const noexcept { return mask_.host<std::int32_t>(); }
  int mask_size() const noexcept { return words_; }

  // What a draw under `sampling` needs of its values (InvalidArgument, before anything changes): a bias of ids in
  // the vocabulary and finite values, penalties finite, answer_start >= 0, a mask that allows some token.
  void check(const SamplingValues& sampling) const;

  // `params`' bias, penalty and mask fields from `sampling` (checked already); a bias other than the one the
  // device holds is copied into `program`'s on `stream`, ahead of the draw that reads it.
  void stage(const SamplingValues& sampling, kernels::SampleParams& params, const DecodeProgram& program,
             cudaStream_t stream);

 private:
  int n_vocab_, words_;
  PinnedMapped mask_;
  std::unique_ptr<PinnedMapped> bias_host_;     // [n_vocab] the dense bias, made on the first draw with one
  std::vector<std::pair<int, float>> biased_;   // the bias the device holds (its non-zero entries as given)
};

}  // namespace strata
