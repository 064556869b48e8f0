// kernel_check round trip of the KV streaming window (strata/check/kernel_check_kv_window.hpp).
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "../kernels/attention.cuh"
#include "../kernels/kv_window.cuh"
#include "../runtime/pinned_memory.hpp"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check_kv_window.hpp"
#include "strata/kv_window.hpp"
#include "strata/session_layout.hpp"

namespace strata::kernel_check {
namespace {

using support::GuardedOutput;
using support::kGuardBytes;
using support::kPoison;
using support::upload;

// Mapped pinned host memory with poisoned guard bands on both sides, as the host copy of a window lives in.
class GuardedPinned {
 public:
  GuardedPinned(const unsigned char* initial, std::size_t bytes) : bytes_(bytes), memory_(bytes + 2 * kGuardBytes) {
    std::memset(memory_.host<unsigned char>(), kPoison, memory_.bytes());
    std::memcpy(memory_.host<unsigned char>(kGuardBytes), initial, bytes);
  }
  void* device() const noexcept { return memory_.device<void>(kGuardBytes); }
  // Copies the bytes out once the device is idle, after proving the guard bands untouched.
  void copy_out(unsigned char* host, const char* what) const {
    const unsigned char* all = memory_.host<unsigned char>();
    for (std::size_t i = 0; i < kGuardBytes; ++i)
      STRATA_EXPECTS(all[i] == kPoison && all[kGuardBytes + bytes_ + i] == kPoison, Error,
                     std::string(what) + " was written outside its bounds");
    std::memcpy(host, all + kGuardBytes, bytes_);
  }

 private:
  std::size_t bytes_;
  PinnedMapped memory_;
};

// In stream order, so the graphs replayed on `stream` see the copy.
void copy_in(void* dst, const void* host, std::size_t bytes, cudaStream_t stream) {
  STRATA_CUDA_TRY(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream));
}

void launched(cudaError_t error, const char* launcher) {
  STRATA_EXPECTS(error == cudaSuccess, InvalidArgument,
                 std::string("kv_window_steps: ") + launcher + " refused its arguments (" + cudaGetErrorName(error) +
                     ")");
}

std::size_t host_elements(const KvWindowCheckShape& s) {
  return static_cast<std::size_t>(s.context) * s.n_head_kv * s.head_dim;
}

void check_shape(const KvWindowCheckShape& s) {
  STRATA_EXPECTS(s.n_head_kv > 0 && s.head_dim > 0 && s.head_dim % kKvGroup == 0 && s.ratio > 0 &&
                     kKvPageTokens % s.ratio == 0 && s.context > 0 && s.context % kKvPageTokens == 0 &&
                     s.slots > 0 && s.keep_blocks >= 0 && s.n_head >= 0 && s.n_head % s.n_head_kv == 0,
                 InvalidArgument,
                 "kv_window_steps: need kv heads > 0, head_dim a multiple of 32, a ratio dividing " +
                     std::to_string(kKvPageTokens) + ", a context of whole pages, slots > 0 and q heads a " +
                     "multiple of the kv heads; got " + std::to_string(s.n_head_kv) + " kv heads of " +
                     std::to_string(s.head_dim) + ", ratio " + std::to_string(s.ratio) + ", context " +
                     std::to_string(s.context) + ", " + std::to_string(s.slots) + " slots, " +
                     std::to_string(s.n_head) + " q heads");
}

// Every token's position inside the context and its selection ascending complete blocks (what attention_decode
// and the fill take on trust).
void check_tokens(const KvWindowCheckShape& s, const KvWindowCheckTokens& tokens) {
  STRATA_EXPECTS(tokens.count > 0, InvalidArgument, "kv_window_steps: no tokens");
  for (int t = 0; t < tokens.count; ++t) {
    const int p = tokens.positions[t], n = tokens.n_selected[t];
    const std::string token = "kv_window_steps: token " + std::to_string(t) + " (position " + std::to_string(p) + ")";
    STRATA_EXPECTS(p >= 0 && p < s.context, InvalidArgument, token + " is outside the context");
    STRATA_EXPECTS(n >= 0 && n <= s.keep_blocks, InvalidArgument,
                   token + " selects " + std::to_string(n) + " blocks, keep_blocks is " +
                       std::to_string(s.keep_blocks));
    const int* blocks = tokens.selected + static_cast<std::size_t>(t) * s.keep_blocks;
    for (int i = 0; i < n; ++i)
      STRATA_EXPECTS(blocks[i] >= (i ? blocks[i - 1] + 1 : 0) && blocks[i] < (p + 1) / s.ratio, InvalidArgument,
                     token + ": selected blocks must be ascending complete blocks, entry " + std::to_string(i) +
                         " is " + std::to_string(blocks[i]));
  }
}

// One token's row of one half (every kv head's codes, then their scales) stored at `row_of(head)` in `half`.
template <class RowOf>
void write_token_row(const kernels::KvHalf& half, int n_head_kv, int head_dim, const unsigned char* row, RowOf row_of,
                     cudaStream_t stream) {
  const std::size_t codes = kv_code_bytes(half.codes, head_dim), scales = kv_scale_bytes(half.codes, head_dim);
  for (int j = 0; j < n_head_kv; ++j) {
    const std::size_t at = row_of(j);
    copy_in(static_cast<unsigned char*>(half.data) + at * codes, row + j * codes, codes, stream);
    if (scales == 0) continue;
    copy_in(reinterpret_cast<unsigned char*>(half.scale) + at * scales, row + n_head_kv * codes + j * scales, scales,
            stream);
  }
}

// The window's bookkeeping read back out of its region's bytes.
struct WindowState {
  int* slot_of;
  int* owner;
  int* stamps;
  unsigned long long* fetched;
};

void read_state(const std::vector<unsigned char>& region, const KvWindowLayout& l, int blocks, int slots,
                const WindowState& to) {
  std::memcpy(to.slot_of, region.data() + l.slot_of, sizeof(int) * blocks);
  std::memcpy(to.owner, region.data() + l.owner, sizeof(int) * slots);
  std::memcpy(to.stamps, region.data() + l.stamps, sizeof(int) * slots);
  std::memcpy(to.fetched, region.data() + l.fetched_bytes, sizeof(unsigned long long));
}

}  // namespace

KvWindowCheckSizes kv_window_check_sizes(const KvWindowCheckShape& s) {
  check_shape(s);
  const KvCodes keys = kv_key_codes(s.kv), values = kv_value_codes(s.kv);
  const std::size_t window = static_cast<std::size_t>(s.slots) * s.ratio * s.n_head_kv * s.head_dim;
  const std::size_t row = static_cast<std::size_t>(s.n_head_kv) * s.head_dim;
  KvWindowCheckSizes sizes;
  sizes.host_keys = kv_half_bytes(keys, host_elements(s));
  sizes.host_values = kv_half_bytes(values, host_elements(s));
  sizes.window_keys = kv_half_bytes(keys, window);
  sizes.window_values = kv_half_bytes(values, window);
  sizes.key_row = kv_half_bytes(keys, row);
  sizes.value_row = kv_half_bytes(values, row);
  sizes.region = kv_window_bytes(keys, values, s.n_head_kv, s.head_dim, s.ratio, s.slots, s.context);
  sizes.slot = kv_window_slot_bytes(keys, values, s.n_head_kv, s.head_dim, s.ratio);
  return sizes;
}

void kv_window_steps(int device, const KvWindowCheckShape& s, const unsigned char* host_keys,
                     const unsigned char* host_values, const KvWindowCheckTokens& tokens,
                     const KvWindowCheckOutputs& out) {
  const KvWindowCheckSizes sizes = kv_window_check_sizes(s);
  check_tokens(s, tokens);
  support::check_device(device);
  DeviceScope scope(device);
  const KvCodes key_codes = kv_key_codes(s.kv), value_codes = kv_value_codes(s.kv);
  const int pages = s.context / kKvPageTokens, blocks = s.context / s.ratio, d = s.head_dim;
  const KvWindowLayout layout =
      kv_window_layout(key_codes, value_codes, s.n_head_kv, d, s.ratio, s.slots, s.context);

  // The host copy (mapped pinned, identity page table), the window over it, and the whole cache in VRAM.
  GuardedPinned host_k(host_keys, sizes.host_keys), host_v(host_values, sizes.host_values);
  std::vector<int> identity(pages);
  for (int i = 0; i < pages; ++i) identity[i] = i;
  DeviceBuffer table = upload(identity.data(), pages * sizeof(int));
  const kernels::PagedKv host{kernels::kv_half(key_codes, host_k.device(), host_elements(s)),
                              kernels::kv_half(value_codes, host_v.device(), host_elements(s)),
                              s.n_head_kv, d, kKvPageTokens, pages, table.as<int>()};
  GuardedOutput region(layout.total);
  const kernels::KvWindow w = kernels::kv_window(region.data<void>(), host, s.ratio, s.slots, s.keep_blocks);
  DeviceBuffer whole_k = upload(host_keys, sizes.host_keys), whole_v = upload(host_values, sizes.host_values);
  const kernels::PagedKv whole{kernels::kv_half(key_codes, whole_k.as<void>(), host_elements(s)),
                               kernels::kv_half(value_codes, whole_v.as<void>(), host_elements(s)),
                               s.n_head_kv, d, kKvPageTokens, pages, table.as<int>()};

  // Per-token values in device memory, as the session stages them.
  DeviceBuffer d_pos(sizeof(int)), d_count(sizeof(int)), d_selected((s.keep_blocks + 1) * sizeof(int));
  const bool attend = tokens.q != nullptr;
  const int heads = attend ? s.n_head : 0;
  const std::size_t hd = static_cast<std::size_t>(heads) * d;
  const kernels::AttentionShape shape{heads, s.n_head_kv, d, 0, 1e-6f};
  STRATA_EXPECTS(!attend || kernels::attention_decode_fits(shape), InvalidArgument,
                 "kv_window_steps: attention_decode does not take " + std::to_string(heads) + " q heads over " +
                     std::to_string(s.n_head_kv) + " kv heads of " + std::to_string(d));
  DeviceBuffer d_q(hd * sizeof(float)), d_qg(2 * hd * sizeof(float));
  const std::size_t partial_bytes = attend ? kernels::attention_decode_partial_floats(shape) * sizeof(float) : 0;
  DeviceBuffer window_partials(partial_bytes), whole_partials(partial_bytes);
  GuardedOutput window_out(hd * sizeof(float)), whole_out(hd * sizeof(float));
  const auto decode_args = [&](const DeviceBuffer& partials, const GuardedOutput& to) {
    kernels::AttentionDecodeArgs args;
    args.q = d_q.as<float>();
    args.q_gate = d_qg.as<float>();
    args.position = d_pos.as<int>();
    args.selected_blocks = d_selected.as<int>();
    args.n_selected = d_count.as<int>();
    args.block_tokens = s.ratio;
    args.out = to.data<float>();
    kernels::carve_attention_partials(shape, partials.as<float>(), args);
    return args;
  };
  const kernels::AttentionDecodeArgs window_args = decode_args(window_partials, window_out);
  const kernels::AttentionDecodeArgs whole_args = decode_args(whole_partials, whole_out);

  // The counter starts at 0 as a session's arena reset leaves it (kv_window_reset keeps counting).
  STRATA_CUDA_TRY(cudaMemset(w.fetched_bytes, 0, sizeof(*w.fetched_bytes)));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());  // the uploads and the poison, before work on a stream of our own
  Stream stream;
  const cudaStream_t on_stream = stream.get();
  launched(kernels::kv_window_reset(w, on_stream), "kv_window_reset");
  STRATA_CUDA_TRY(cudaStreamSynchronize(on_stream));  // an idle stream to capture on
  const CapturedGraph claim(on_stream, [&](cudaStream_t on) {
    launched(kernels::kv_window_claim(w, d_pos.as<int>(), on), "kv_window_claim");
  });
  const CapturedGraph fill(on_stream, [&](cudaStream_t on) {
    launched(kernels::kv_window_fill(w, d_selected.as<int>(), d_count.as<int>(), d_pos.as<int>(), on),
             "kv_window_fill");
    if (attend) launched(kernels::attention_decode(shape, window_args, w.window(), on), "attention_decode (window)");
  });

  std::vector<unsigned char> bytes(layout.total);
  for (int t = 0; t < tokens.count; ++t) {
    const int p = tokens.positions[t];
    if (tokens.resets[t]) launched(kernels::kv_window_reset(w, on_stream), "kv_window_reset");
    copy_in(d_pos.as<void>(), &p, sizeof(int), on_stream);
    copy_in(d_count.as<void>(), tokens.n_selected + t, sizeof(int), on_stream);
    if (s.keep_blocks > 0)
      copy_in(d_selected.as<void>(), tokens.selected + static_cast<std::size_t>(t) * s.keep_blocks,
              s.keep_blocks * sizeof(int), on_stream);
    if (attend) {
      copy_in(d_q.as<void>(), tokens.q + t * hd, hd * sizeof(float), on_stream);
      copy_in(d_qg.as<void>(), tokens.q_gate + t * 2 * hd, 2 * hd * sizeof(float), on_stream);
    }
    claim.launch(on_stream);
    int slot = -1;
    STRATA_CUDA_TRY(cudaMemcpyAsync(&slot, w.slot_of + p / s.ratio, sizeof(int), cudaMemcpyDeviceToHost, on_stream));
    STRATA_CUDA_TRY(cudaStreamSynchronize(on_stream));
    STRATA_EXPECTS(slot >= 0 && slot < s.slots, Error,
                   "kv_window_claim left block " + std::to_string(p / s.ratio) + " without a slot (" +
                       std::to_string(slot) + ")");
    const auto window_row = [&](int j) {
      return (static_cast<std::size_t>(slot) * s.n_head_kv + j) * s.ratio + p % s.ratio;
    };
    const auto whole_row = [&](int j) {
      return (static_cast<std::size_t>(p / kKvPageTokens) * s.n_head_kv + j) * kKvPageTokens + p % kKvPageTokens;
    };
    const unsigned char* key_row = tokens.key_rows + t * sizes.key_row;
    const unsigned char* value_row = tokens.value_rows + t * sizes.value_row;
    write_token_row(w.keys, s.n_head_kv, d, key_row, window_row, on_stream);
    write_token_row(w.values, s.n_head_kv, d, value_row, window_row, on_stream);
    write_token_row(whole.keys, s.n_head_kv, d, key_row, whole_row, on_stream);
    write_token_row(whole.values, s.n_head_kv, d, value_row, whole_row, on_stream);
    fill.launch(on_stream);
    if (attend) launched(kernels::attention_decode(shape, whole_args, whole, on_stream), "attention_decode (whole)");
    STRATA_CUDA_TRY(cudaStreamSynchronize(on_stream));

    region.copy_out(bytes.data(), "kv_window_claim / kv_window_fill");
    read_state(bytes, layout, blocks, s.slots,
               {out.slot_of + static_cast<std::size_t>(t) * blocks, out.owner + static_cast<std::size_t>(t) * s.slots,
                out.stamps + static_cast<std::size_t>(t) * s.slots, out.fetched + t});
    std::memcpy(out.window_keys + t * sizes.window_keys, bytes.data() + layout.keys, sizes.window_keys);
    std::memcpy(out.window_values + t * sizes.window_values, bytes.data() + layout.values, sizes.window_values);
    if (!attend) continue;
    window_out.copy_out(out.out_window + t * hd, "attention_decode (window)");
    whole_out.copy_out(out.out_whole + t * hd, "attention_decode (whole)");
  }
  host_k.copy_out(out.host_keys, "the host copy's keys");
  host_v.copy_out(out.host_values, "the host copy's values");
  launched(kernels::kv_window_reset(w, on_stream), "kv_window_reset");
  STRATA_CUDA_TRY(cudaStreamSynchronize(on_stream));
  region.copy_out(bytes.data(), "kv_window_reset");
  read_state(bytes, layout, blocks, s.slots, {out.reset_slot_of, out.reset_owner, out.reset_stamps, out.reset_fetched});
}

}  // namespace strata::kernel_check
