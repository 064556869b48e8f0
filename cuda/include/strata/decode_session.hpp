// One sequence decoding on the GPU and the CPU pool: every layer's dense part on the device, the routed
// experts answered by the pool through the doorbell, the LM head and the sampler on the device; only the
// token id comes back. Three modes give identical tokens (docs/session.md). Host-only header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/session_layout.hpp"

namespace strata {

class DeviceWeights;
namespace cpu {
class ExpertPool;
}

enum class Arch : int { Qwen4Exp = 0, Qwen3Next = 1, Qwen35Moe = 2 };

// What the decode program needs of strata.models.Geometry (strata.session_geometry builds it).
struct DecodeGeometry {
  Arch arch = Arch::Qwen4Exp;
  int n_layer = 0, n_embd = 0, n_vocab = 0;
  std::vector<bool> recurrent;
  int n_head = 0, n_head_kv = 0, head_dim = 0, rope_dim = 0;
  double rope_theta = 0.0;
  float rms_eps = 1e-6f;
  int ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_k_dim = 0, ssm_head_v_dim = 0, ssm_conv_kernel = 0;
  int n_expert = 0, n_expert_used = 0, expert_ff = 0, shared_ff = 0;
  int hc_count = 0, hc_rank = 0;  // 0: one residual stream with pre-norms (qwen3next, qwen35moe)
  int indexer_heads = 0, indexer_head_dim = 0, indexer_budget = 0;
  std::vector<int> compress_ratios;  // per layer, QSA block tokens on indexed attention layers
  int ple_layer = -1, ple_ngram = 0, ple_conv_kernel = 0, ple_n_heads = 0, ple_head_dim = 0;
};

enum class DecodeMode : int { kUncaptured = 0, kLayerGraphs = 1, kTokenGraph = 2 };

struct DecodeOptions {
  int device = 0;
  int context = 4096;
  KvStorage kv = KvStorage::Int8;
  DecodeMode mode = DecodeMode::kTokenGraph;
  double timeout_seconds = 5.0;  // the GPU's wait for an answer; the host waits 3x this for a ring
};

// One token's sampling, as strata.sampling.SamplingParams defines it.
struct SamplingValues {
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  float repeat_penalty = 1.0f;
  int top_k = 0;
};

// Sums since construction or reset().
struct DecodeStats {
  long tokens = 0;
  double seconds = 0.0;            // wall time of step() calls
  double ring_wait_seconds = 0.0;  // the host spinning for rings (GPU work before each router)
  double pool_seconds = 0.0;       // the pool computing routed experts
  long rings = 0;
  double gpu_pre_seconds = 0.0;    // uncaptured mode only: device time of the layers' pre parts (+ embed)
  double gpu_post_seconds = 0.0;   // uncaptured mode only: device time of the post parts (+ head, sampler)
};

class DecodeSession {
 public:
  // Checks every tensor the program reads against the geometry (InvalidArgument naming the tensor), plans
  // and allocates the arena and scratch (OutOfMemory naming the need), builds the RoPE tables.
  DecodeSession(const DeviceWeights& weights, cpu::ExpertPool& pool, const DecodeGeometry& geometry,
                const DecodeOptions& options);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // Appends `token` at the next position and runs every layer and the LM head; with `sample`, returns the
  // sampled next token for the uniform draw u (repetition penalty over every token fed so far), else -1.
  // ple_rows: [ple_n_heads][ple_head_dim] float32 n-gram table rows of this token (required with PLE).
  int step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample);

  void logits(float* out) const;   // [n_vocab] of the last step
  void streams(float* out) const;  // [max(hc_count, 1)][n_embd] residual streams after the last step
  void reset();                    // an empty sequence; stats start over

  int position() const noexcept;
  int context() const noexcept;
  DecodeMode mode() const noexcept;
  bool captured() const noexcept;  // graph modes: the graphs exist (captured on the first step)
  const DecodeStats& stats() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
