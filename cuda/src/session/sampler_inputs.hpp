// What a session's sampler reads beside its stage values (kernels::SampleInputs, docs/structured.md "Where it
// runs"): the token mask's words, in page-locked memory mapped into the device, which the host writes in place
// before a draw or, for step()'s draw, while the device runs the token (publishing the draw's ticket once they are
// written: the sampler waits for it); and the logit bias, kept dense on the device and copied there only when a
// draw's bias differs from the one it holds (a request's bias is the same for all its draws). The answer's counts
// for the frequency and presence penalties need no host part: the sampler counts the sequence's history on the
// device.
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
  // `timeout_seconds`: how long the sampler waits for a mask published after the launch.
  SamplerInputs(int n_vocab, double timeout_seconds);

  // The mask's words as the device reads them (ProgramIo::token_mask) and as the host writes them.
  const unsigned* mask_device() const noexcept { return mask_.device<unsigned>(); }
  std::int32_t* mask_words() const noexcept { return mask_.host<std::int32_t>(); }
  int mask_size() const noexcept { return words_; }
  // Where the sampler waits for a mask published after the launch (ProgramIo::mask_published).
  kernels::MaskPublication publication() const noexcept;

  // What a draw under `sampling` needs of its values (InvalidArgument, before anything changes): a bias of ids in
  // the vocabulary and finite values, penalties finite, answer_start >= 0, a mask that allows some token (checked
  // after the launch where the mask comes then, check_mask); a mask_ticket only with a mask, and only where the
  // caller `defers` (step() does; the steps of several rows and the prompt path do not).
  void check(const SamplingValues& sampling, bool defers) const;
  // InvalidArgument unless the words allow some token of the vocabulary.
  void check_mask() const;

  // `params`' bias, penalty and mask fields from `sampling` (checked already); a bias other than the one the
  // device holds is copied into `program`'s on `stream`, ahead of the draw that reads it.
  void stage(const SamplingValues& sampling, kernels::SampleParams& params, const DecodeProgram& program,
             cudaStream_t stream);

  // The words of the draw `ticket` are written (by any thread): the sampler waiting for it goes on.
  void publish(unsigned ticket) const noexcept;
  // After the draw staged with `params`: throws Error naming the draw where the sampler gave up waiting for its mask.
  void check_published(const kernels::SampleParams& params) const;

 private:
  int n_vocab_, words_;
  double timeout_seconds_;
  PinnedMapped mask_;
  PinnedMapped publication_;  // MaskPublication's ready and late words, each on its own cache line
  std::unique_ptr<PinnedMapped> bias_host_;     // [n_vocab] the dense bias, made on the first draw with one
  std::vector<std::pair<int, float>> biased_;   // the bias the device holds (its non-zero entries as given)
};

}  // namespace strata
