// What the decode program and the prompt program read and neither owns, as one value (docs/session.md): the
// model's side (its resolved tensors, the embedding gather's view of token_embd, the attention shape and the RoPE
// tables of the context), made once by ProgramTables, and the sequence's side (its device views, the penalty's
// history of every token fed and its control vectors), which the Sequence owns. A runner builds one ProgramInputs
// for the sequence it steps and gives it to each of its programs.
#pragma once

#include <cstddef>

#include "../../kernels/attention.cuh"
#include "../../kernels/embed.cuh"
#include "../../runtime/device_buffer.hpp"
#include "../state/sequence.hpp"
#include "../weights/decode_tensors.hpp"
#include "strata/device_weights.hpp"
#include "strata/geometry.hpp"

namespace strata {

struct ProgramInputs {
  const ModelTensors* tensors = nullptr;
  kernels::EmbedTable embedding;     // token_embd as the row gather reads it
  kernels::AttentionShape attention;
  const float* rope_cos = nullptr;   // [context][rope_dim / 2]
  const float* rope_sin = nullptr;
  SequenceViews sequence;            // the stepped sequence's state
  const SessionLayout* layout = nullptr;  // ... and its arena's layout
  int* history = nullptr;            // [context] its every token fed, for the repetition penalty
  const Steering* steering = nullptr;  // its control vectors, read when a program enqueues a layer's last write
};

// The model's side of ProgramInputs for sequences of `context` tokens (whole KV pages): built once, read by every
// program of every sequence of that context.
class ProgramTables {
 public:
  // Refuses, before anything is allocated, an embedding form the row gather lacks and an attention shape the
  // decode kernel cannot hold.
  ProgramTables(const DeviceWeights& weights, const ModelGeometry& g, int context);

  // Device bytes of the tables for `context` tokens: what the memory plan counts.
  static std::size_t bytes(const ModelGeometry& g, int context);

  const ModelTensors& tensors() const noexcept { return t_; }

  // The inputs of a program that steps `sequence`.
  ProgramInputs inputs(const Sequence& sequence) const;

 private:
  ModelTensors t_;
  kernels::EmbedTable embedding_;
  kernels::AttentionShape attention_;
  DeviceBuffer rope_;
  float *cos_ = nullptr, *sin_ = nullptr;
};

}  // namespace strata
