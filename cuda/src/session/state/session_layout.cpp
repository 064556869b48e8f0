#include "strata/session_layout.hpp"

#include "strata/error.hpp"
#include "strata/kv_window.hpp"

namespace strata {
namespace {

constexpr std::size_t kFloat = 4;

class Builder {
 public:
  void add(const std::string& name, int layer, std::size_t bytes, Place place = Place::Device) {
    std::size_t& end = place == Place::Host ? layout.host_total : layout.total;
    layout.regions.push_back({name, layer, end, bytes, place});
    end += region_span(bytes);
    if (is_recurrent_state(name)) layout.state_bytes += region_span(bytes);
  }
  SessionLayout layout;
};

void check(const ModelGeometry& g, int context, KvStorage kv) {
  check_geometry(g);
  STRATA_EXPECTS(context > 0, InvalidArgument, "context must be > 0, got " + std::to_string(context));
  STRATA_EXPECTS(g.head_dim % kKvGroup == 0, InvalidArgument,
                 "head_dim " + std::to_string(g.head_dim) + " is not a multiple of 32 (KV groups)");
  STRATA_EXPECTS(is_kv_storage(static_cast<int>(kv)), InvalidArgument,
                 "unknown KV storage " + std::to_string(static_cast<int>(kv)) + " (strata/kv_format.hpp)");
}

}  // namespace

bool is_recurrent_state(const std::string& region) {
  return region == "gdn state" || region == "gdn conv history" || region == "ple history";
}

std::size_t SessionLayout::bytes_of(const std::string& name) const {
  std::size_t sum = 0;
  for (const Region& r : regions)
    if (r.name == name) sum += r.bytes;
  return sum;
}

std::size_t SessionLayout::slot_offset(const std::string& name, int layer) const {
  std::size_t at = 0;
  for (const Region& r : regions) {
    if (!is_recurrent_state(r.name)) continue;
    if (r.name == name && r.layer == layer) return at;
    at += region_span(r.bytes);
  }
  throw InvalidArgument("the session's state snapshots hold no region '" + name + "' for layer " +
                        std::to_string(layer));
}

std::size_t kv_half_region_bytes(const ModelGeometry& g, int context, KvStorage kv, bool values) {
  const int pages = (context + kKvPageTokens - 1) / kKvPageTokens;
  const std::size_t elements = static_cast<std::size_t>(pages) * kKvPageTokens * g.n_head_kv * g.head_dim;
  return kv_half_bytes(values ? kv_value_codes(kv) : kv_key_codes(kv), elements);
}

SessionLayout plan_session(const ModelGeometry& g, int context, KvStorage kv, int snapshots, bool kv_streaming) {
  check(g, context, kv);
  STRATA_EXPECTS(!kv_streaming || g.attention_layers() == 0 || g.indexer_head_dim > 0, InvalidArgument,
                 "KV streaming keeps in VRAM only the blocks a QSA indexer selects; this model's attention layers "
                 "have no indexer and read every cell of their context, so their KV must stay in VRAM");
  STRATA_EXPECTS(snapshots >= 0 && snapshots <= kMaxSnapshots, InvalidArgument,
                 "state snapshots must be in 0.." + std::to_string(kMaxSnapshots) + ", got " +
                     std::to_string(snapshots));
  Builder b;
  const int pages = (context + kKvPageTokens - 1) / kKvPageTokens;
  const std::size_t cells = static_cast<std::size_t>(pages) * kKvPageTokens;
  b.layout.kv_pages = pages;
  for (int l = 0; l < g.n_layer; ++l) {
    if (g.recurrent[l]) {
      b.add("gdn state", l, kFloat * g.ssm_n_v_heads * g.ssm_head_k_dim * g.ssm_head_v_dim);
      b.add("gdn conv history", l, kFloat * (g.ssm_conv_kernel - 1) * g.conv_channels());
      continue;
    }
    // Streaming: the whole KV and the raw indexer keys (read only to pool the open block) on the host; the pooled
    // block keys, which every token scores, and the window stay in VRAM.
    const Place home = kv_streaming ? Place::Host : Place::Device;
    b.add("kv keys", l, kv_half_region_bytes(g, context, kv, false), home);
    b.add("kv values", l, kv_half_region_bytes(g, context, kv, true), home);
    b.add("kv page table", l, sizeof(int) * pages);
    if (g.indexer_head_dim) {
      const int ratio = g.compress_ratios[l];
      const std::size_t blocks = cells / ratio;
      b.add("indexer raw keys", l, kFloat * cells * g.indexer_head_dim, home);  // f32, as kernels/qsa.cuh keeps them
      b.add("indexer block keys", l, kFloat * blocks * g.indexer_head_dim);
      if (kv_streaming) {
        const int slots = kv_window_slots(g.indexer_top_k / ratio);
        b.layout.window_slots = slots;
        b.add("kv window", l, kv_window_bytes(kv_key_codes(kv), kv_value_codes(kv), g.n_head_kv, g.head_dim, ratio,
                                              slots, static_cast<int>(cells)));
      }
    }
  }
  b.layout.kv_streaming = kv_streaming && g.attention_layers() > 0;
  if (g.ple_layer >= 0) b.add("ple history", -1, kFloat * g.ple_history() * g.hc_count * g.n_embd);
  b.add("residual streams", -1, kFloat * g.streams() * g.n_embd);
  b.layout.snapshots = snapshots;
  if (snapshots > 0) b.add("state snapshots", -1, static_cast<std::size_t>(snapshots) * b.layout.state_bytes);
  return b.layout;
}

}  // namespace strata
