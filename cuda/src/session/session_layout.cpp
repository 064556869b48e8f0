#include "strata/session_layout.hpp"

#include "strata/error.hpp"

namespace strata {
namespace {

constexpr std::size_t kAlign = 256;
constexpr std::size_t kFloat = 4;

class Builder {
 public:
  void add(const std::string& name, int layer, std::size_t bytes) {
    layout.regions.push_back({name, layer, layout.total, bytes});
    layout.total += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  SessionLayout layout;
};

std::size_t kv_bytes(const SessionShape& s, int pages, KvStorage kv) {
  const std::size_t elements = static_cast<std::size_t>(pages) * kKvPageTokens * s.n_head_kv * s.head_dim;
  // int8: one fp16 scale per 32 elements (kernels/kv.cuh)
  return kv == KvStorage::Bf16 ? 2 * elements : elements + elements / 32 * 2;
}

void check(const SessionShape& s, int context) {
  STRATA_EXPECTS(!s.recurrent.empty() && s.n_embd > 0 && s.n_vocab > 0, InvalidArgument,
                 "session shape: layers, n_embd and n_vocab must be positive");
  STRATA_EXPECTS(context > 0, InvalidArgument, "context must be > 0, got " + std::to_string(context));
  STRATA_EXPECTS(s.head_dim % 32 == 0, InvalidArgument,
                 "head_dim " + std::to_string(s.head_dim) + " is not a multiple of 32 (KV groups)");
}

}  // namespace

std::size_t SessionLayout::bytes_of(const std::string& name) const {
  std::size_t sum = 0;
  for (const Region& r : regions)
    if (r.name == name) sum += r.bytes;
  return sum;
}

SessionLayout plan_session(const SessionShape& s, int context, KvStorage kv) {
  check(s, context);
  Builder b;
  const int pages = (context + kKvPageTokens - 1) / kKvPageTokens;
  const std::size_t cells = static_cast<std::size_t>(pages) * kKvPageTokens;
  const int conv_channels = 2 * s.ssm_k_heads * s.ssm_head_k_dim + s.ssm_v_heads * s.ssm_head_v_dim;
  b.layout.kv_pages = pages;
  for (int l = 0; l < static_cast<int>(s.recurrent.size()); ++l) {
    if (s.recurrent[l]) {
      b.add("gdn state", l, kFloat * s.ssm_v_heads * s.ssm_head_k_dim * s.ssm_head_v_dim);
      b.add("gdn conv history", l, kFloat * (s.ssm_conv_kernel - 1) * conv_channels);
      continue;
    }
    b.add("kv keys", l, kv_bytes(s, pages, kv));
    b.add("kv values", l, kv_bytes(s, pages, kv));
    b.add("kv page table", l, sizeof(int) * pages);
    if (s.indexer_head_dim) {
      const std::size_t blocks = cells / s.indexer_ratio;
      b.add("indexer raw keys", l, kFloat * cells * s.indexer_head_dim);  // f32, as kernels/qsa.cuh keeps them
      b.add("indexer block keys", l, kFloat * blocks * s.indexer_head_dim);
    }
  }
  if (s.n_ple_layers) b.add("ple history", -1, kFloat * s.n_ple_layers * s.ple_history * s.hc_count * s.n_embd);
  b.add("residual streams", -1, kFloat * (s.hc_count ? s.hc_count : 1) * s.n_embd);
  return b.layout;
}

}  // namespace strata
