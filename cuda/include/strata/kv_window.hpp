// The VRAM window of a streamed attention layer's KV cache (kernels/kv_window.cuh): where each of its pieces lies
// in the one region that holds it, and so how many bytes it takes. The session layout and the memory plan size
// the window with it; kv_window() carves a region with it. No CUDA headers: the binding compiles it with the host
// compiler.
#pragma once

#include <cstddef>

#include "strata/kv_format.hpp"

namespace strata {

// Every piece starts on this boundary: the copies' 16-byte loads need 16, the session's regions use 256.
constexpr std::size_t kKvWindowAlign = 256;

// Byte offsets of a window's pieces inside its region (kernels/kv_window.cuh, KvWindow, says what each holds).
struct KvWindowLayout {
  std::size_t keys = 0, values = 0;  // each half of the slots' rows: codes, then scales (kernels/kv.cuh, kv_half)
  std::size_t slot_of = 0;           // int [blocks]: the window's page table
  std::size_t owner = 0;             // int [slots]
  std::size_t stamps = 0;            // int [slots]
  std::size_t clock = 0;             // unsigned
  std::size_t copies = 0;            // int [slots]
  std::size_t n_copies = 0;          // int
  std::size_t fetched_bytes = 0;     // unsigned long long
  std::size_t total = 0;             // the region's bytes
};

constexpr std::size_t kv_window_aligned(std::size_t bytes) {
  return (bytes + kKvWindowAlign - 1) / kKvWindowAlign * kKvWindowAlign;
}

// Places a piece of `bytes` at `at` (the region's end so far), which moves past it; returns its offset.
constexpr std::size_t kv_window_place(std::size_t& at, std::size_t bytes) {
  const std::size_t start = at;
  at += kv_window_aligned(bytes);
  return start;
}

// Bytes of one slot: one QSA block of `ratio` tokens, every kv head, both halves' codes and scales. The same
// count is what fetching one block moves over PCIe.
constexpr std::size_t kv_window_slot_bytes(KvCodes keys, KvCodes values, int n_head_kv, int head_dim, int ratio) {
  const std::size_t elements = static_cast<std::size_t>(ratio) * n_head_kv * head_dim;
  return kv_half_bytes(keys, elements) + kv_half_bytes(values, elements);
}

// The layout of a window of `slots` blocks of `ratio` tokens over a context of `context` tokens (a multiple of
// ratio: the page table has an entry per block of the context).
constexpr KvWindowLayout kv_window_layout(KvCodes keys, KvCodes values, int n_head_kv, int head_dim, int ratio,
                                          int slots, int context) {
  const std::size_t elements = static_cast<std::size_t>(slots) * ratio * n_head_kv * head_dim;
  const std::size_t blocks = static_cast<std::size_t>(context / ratio), n_slots = static_cast<std::size_t>(slots);
  KvWindowLayout l;
  std::size_t at = 0;
  l.keys = kv_window_place(at, kv_half_bytes(keys, elements));
  l.values = kv_window_place(at, kv_half_bytes(values, elements));
  l.slot_of = kv_window_place(at, sizeof(int) * blocks);
  l.owner = kv_window_place(at, sizeof(int) * n_slots);
  l.stamps = kv_window_place(at, sizeof(int) * n_slots);
  l.clock = kv_window_place(at, sizeof(unsigned));
  l.copies = kv_window_place(at, sizeof(int) * n_slots);
  l.n_copies = kv_window_place(at, sizeof(int));
  l.fetched_bytes = kv_window_place(at, sizeof(unsigned long long));
  l.total = at;
  return l;
}

constexpr std::size_t kv_window_bytes(KvCodes keys, KvCodes values, int n_head_kv, int head_dim, int ratio, int slots,
                                      int context) {
  return kv_window_layout(keys, values, n_head_kv, head_dim, ratio, slots, context).total;
}

}  // namespace strata
