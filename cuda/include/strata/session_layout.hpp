// Every byte of one session's sequence state on the GPU, laid out in one arena: the single definition of
// what a session allocates (strata.plan reads it before loading; the session allocates exactly it).
// Host-only header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace strata {

enum class KvStorage : int { Bf16 = 0, Int8 = 1 };

// What the layout depends on (strata.models.Geometry's relevant fields).
struct SessionShape {
  std::vector<bool> recurrent;  // per layer: Gated DeltaNet (true) or attention
  int n_embd = 0;
  int n_vocab = 0;
  int n_head_kv = 0, head_dim = 0;
  int ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_k_dim = 0, ssm_head_v_dim = 0, ssm_conv_kernel = 0;
  int indexer_head_dim = 0;  // 0: no QSA indexer (qwen3next, qwen35moe)
  int indexer_ratio = 4;
  int n_ple_layers = 0, ple_history = 0;  // history rows = (conv_kernel - 1) * dilation
  int hc_count = 0;                       // 0: one residual stream
};

struct Region {
  std::string name;
  int layer = -1;  // -1 for session-wide regions
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct SessionLayout {
  int kv_pages = 0;  // pages per attention layer
  std::vector<Region> regions;
  std::size_t total = 0;

  // Sum of the bytes of every region whose name is `name`.
  std::size_t bytes_of(const std::string& name) const;
};

constexpr int kKvPageTokens = 256;  // tokens per KV page: whole QSA blocks, and the planning granularity

// The layout for `context` tokens; throws InvalidArgument naming an impossible shape or context.
SessionLayout plan_session(const SessionShape& shape, int context, KvStorage kv);

}  // namespace strata
