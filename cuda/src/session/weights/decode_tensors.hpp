// Every tensor one decode token reads, looked up once by GGUF name and checked against the geometry, so a
// file that does not match fails at session creation with the tensor's name instead of during a token.
#pragma once

#include <vector>

#include "strata/device_weights.hpp"
#include "strata/geometry.hpp"

namespace strata {

// One hyper-connection mixer (qwen4exp): `{prefix}_{norm,down,up,inject}.weight`.
struct HcTensors {
  const float* norm = nullptr;             // [hc * n]
  const DeviceTensor* down = nullptr;      // [rank][hc * n]
  const DeviceTensor* up = nullptr;        // [hc * n][rank]
  const DeviceTensor* inject = nullptr;    // [hc][hc * n]; null for the final mixer
};

struct LayerTensors {
  HcTensors hc_attn, hc_ffn;                                    // qwen4exp
  const float* attn_norm = nullptr;                             // one-stream architectures
  const float* post_attention_norm = nullptr;
  // Gated DeltaNet
  const DeviceTensor *qkv = nullptr, *gate = nullptr, *ssm_in = nullptr;  // ssm_in: qwen3next's merged qkv|z
  const DeviceTensor *beta = nullptr, *alpha = nullptr, *ba = nullptr, *ssm_out = nullptr;
  const float *conv1d = nullptr, *ssm_a = nullptr, *dt_bias = nullptr, *ssm_norm = nullptr;
  // gated attention, and the QSA indexer where the layer has one
  const DeviceTensor *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  const DeviceTensor *index_q = nullptr, *index_k = nullptr;
  const float *index_q_norm = nullptr, *index_k_norm = nullptr;
  // MoE: router and shared expert (the routed experts live in the CPU pool)
  const DeviceTensor *router = nullptr, *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
  const float* shared_gate_inp = nullptr;
  // PLE (one qwen4exp layer)
  const DeviceTensor *ple_key = nullptr, *ple_value = nullptr;
  const float *ple_norm_key = nullptr, *ple_norm_query = nullptr, *ple_norm_conv = nullptr, *ple_conv = nullptr;
};

struct ModelTensors {
  const DeviceTensor* embedding = nullptr;  // token_embd
  const DeviceTensor* head = nullptr;       // output, or token_embd when tied
  HcTensors output_hc;                      // qwen4exp
  const float* output_norm = nullptr;       // one-stream architectures
  std::vector<LayerTensors> layers;
};

// Throws InvalidArgument naming the first tensor that is missing, has the wrong shape, or a form the
// kernels lack (elementwise tensors must be float32: the loader converts them).
ModelTensors resolve_tensors(const DeviceWeights& weights, const ModelGeometry& g);

}  // namespace strata
