// Host round trip of the KV streaming window (kernels/kv_window.cuh): a host copy in mapped pinned memory, a VRAM
// window over it, and a sequence of decoded tokens each claiming, writing its row and filling as a session would;
// attention_decode over the window beside attention_decode over a whole cache in VRAM holding the same rows. Not
// for the token path: it allocates and synchronises. Host-only header (no CUDA types).
#pragma once

#include <cstddef>

#include "strata/kv_format.hpp"

namespace strata::kernel_check {

struct KvWindowCheckShape {
  int n_head_kv = 0, head_dim = 0;
  int ratio = 4, keep_blocks = 0, slots = 0;
  int context = 0;  // tokens of the host copy: a multiple of kKvPageTokens (pages of the host copy)
  int n_head = 0;   // q heads of the attention comparison; 0: none
  KvStorage kv = KvStorage::Bf16;
};

// Bytes of the check's pieces for a shape, so callers can size their arrays.
struct KvWindowCheckSizes {
  std::size_t host_keys = 0, host_values = 0;      // each half of the host copy: codes, then scales
  std::size_t window_keys = 0, window_values = 0;  // each half of the window's slots: codes, then scales
  std::size_t key_row = 0, value_row = 0;          // one token's row of a half: every kv head's codes, then scales
  std::size_t region = 0;                          // the window's VRAM region (kv_window_bytes)
  std::size_t slot = 0;                            // one slot (kv_window_slot_bytes): one block fetched
};
KvWindowCheckSizes kv_window_check_sizes(const KvWindowCheckShape& shape);

// The tokens, in order. Before token t: a reset if resets[t] (as after the prompt path rewrote the host copy);
// then kv_window_claim; then the row of position p written into the window (as attention_prep writes it) and into
// the whole cache; then kv_window_fill with the first n_selected[t] blocks of selected[t] (ascending complete
// blocks); then, with q, attention_decode of that selection over the window and over the whole cache. Claim and
// fill (+ attention) each run as a captured graph, replayed per token with the position and the selection
// rewritten in device memory.
struct KvWindowCheckTokens {
  int count = 0;
  const int* positions = nullptr;            // [count]
  const int* selected = nullptr;             // [count][keep_blocks]
  const int* n_selected = nullptr;           // [count]
  const unsigned char* resets = nullptr;     // [count]
  const unsigned char* key_rows = nullptr;   // [count][key_row bytes]
  const unsigned char* value_rows = nullptr; // [count][value_row bytes]
  const float* q = nullptr;                  // [count][n_head][head_dim] (in the keys' basis); nullptr: none
  const float* q_gate = nullptr;             // [count][n_head][2 * head_dim]
};

// What the window holds after each token's fill, and after a last reset. The host copy (host_keys, host_values
// of kv_window_check_sizes bytes) is read back at the end.
struct KvWindowCheckOutputs {
  int* slot_of = nullptr;                  // [count][blocks]: the window's page table
  int* owner = nullptr;                    // [count][slots]
  int* stamps = nullptr;                   // [count][slots]
  unsigned long long* fetched = nullptr;   // [count]
  unsigned char* window_keys = nullptr;    // [count][window_keys bytes]
  unsigned char* window_values = nullptr;  // [count][window_values bytes]
  unsigned char* host_keys = nullptr;
  unsigned char* host_values = nullptr;
  float* out_window = nullptr;             // [count][n_head][head_dim] attention_decode over the window
  float* out_whole = nullptr;              // [count][n_head][head_dim] over the whole cache
  int* reset_slot_of = nullptr;            // [blocks] after the last reset
  int* reset_owner = nullptr;              // [slots]
  int* reset_stamps = nullptr;             // [slots]
  unsigned long long* reset_fetched = nullptr;
};

// Runs `tokens` over a host copy starting as host_keys, host_values (kv_window_check_sizes bytes each). A launcher
// that refuses the shape throws InvalidArgument naming it.
void kv_window_steps(int device, const KvWindowCheckShape& shape, const unsigned char* host_keys,
                     const unsigned char* host_values, const KvWindowCheckTokens& tokens,
                     const KvWindowCheckOutputs& out);

}  // namespace strata::kernel_check
