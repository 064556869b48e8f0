// KV streaming of a QSA attention layer (docs/models/qwen4exp.md §3(c)): the authoritative cache lives in mapped,
// pinned host memory and VRAM holds only a window of QSA blocks, the ones the current token attends. Per decoded
// token, in stream order:
//   kv_window_claim(p)  makes block p / ratio resident, so attention_prep can write row p into the window;
//   attention_prep      writes row p through window() (its page table maps blocks to slots);
//   qsa_select          chooses the token's blocks;
//   kv_window_fill(p)   writes row p back to the host copy and makes every selected block resident;
//   attention_decode    reads the token's blocks and tail through window(), as from a cache held whole in VRAM.
// The window is a cache of the host copy, which after each fill holds every row up to p: a slot's block can be
// dropped at any time without a write-back, and a session that cuts back to an earlier position needs no reset.
// Positions and selections come from device memory (captured graphs replay them). Launchers never allocate,
// synchronise or throw; bad sizes give cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include "kv.cuh"
#include "strata/kv_window.hpp"

namespace strata::kernels {

// Most slots a window may have: the fill plans its evictions in shared memory, two words per slot.
constexpr int kMaxWindowSlots = 4096;

struct KvWindow {
  // The authoritative cache: halves in mapped pinned host memory (device pointers from cudaHostGetDevicePointer),
  // its page table in device memory; page_size a multiple of ratio, so a block's rows are consecutive there.
  PagedKv host;
  // The window's halves in VRAM: `slots` pages of `ratio` rows per kv head, in host's formats.
  KvHalf keys, values;
  int ratio = 4;        // tokens per QSA block: one block per window page
  int slots = 0;        // pages of the window; at least keep_blocks + 2 (kv_window_fill says why)
  int keep_blocks = 0;  // most blocks a selection holds (the indexer's keep_blocks): what the fill must make room for
  int* slot_of = nullptr;   // [blocks()] block -> slot holding it, -1 not resident: window()'s page table
  int* owner = nullptr;     // [slots] block a slot holds, -1 free: slot_of's inverse
  // [slots] the clock of the last token that needed the slot's block, 0 free: what to evict. A token's clock, not
  // its position: after the session cuts back to an earlier position, the blocks the abandoned tokens stamped must
  // not pass for blocks this token needs (that left the fill too few spare slots for a whole new selection).
  int* stamps = nullptr;
  unsigned* clock = nullptr;  // tokens claimed since the reset: the claim advances it, the fill reads it
  int* copies = nullptr;    // [slots] the fill's plan for its copy grid: the blocks it made resident
  int* n_copies = nullptr;  // blocks in copies
  unsigned long long* fetched_bytes = nullptr;  // every byte claims and fills copied from the host, summed

  __host__ __device__ int context() const { return host.max_pages * host.page_size; }
  __host__ __device__ int blocks() const { return context() / ratio; }
  // The window as attention_prep and attention_decode read it.
  __host__ __device__ PagedKv window() const {
    return PagedKv{keys, values, host.n_head_kv, host.head_dim, ratio, blocks(), slot_of};
  }
};

// The window over `host` carved from `region` (kv_window_bytes(...) bytes of VRAM, laid out by kv_window_layout).
inline KvWindow kv_window(void* region, const PagedKv& host, int ratio, int slots, int keep_blocks) {
  const KvCodes key_codes = host.keys.codes, value_codes = host.values.codes;
  const int context = host.max_pages * host.page_size;
  const KvWindowLayout l =
      kv_window_layout(key_codes, value_codes, host.n_head_kv, host.head_dim, ratio, slots, context);
  const std::size_t elements = static_cast<std::size_t>(slots) * ratio * host.n_head_kv * host.head_dim;
  char* base = static_cast<char*>(region);
  KvWindow w;
  w.host = host;
  w.keys = kv_half(key_codes, base + l.keys, elements);
  w.values = kv_half(value_codes, base + l.values, elements);
  w.ratio = ratio;
  w.slots = slots;
  w.keep_blocks = keep_blocks;
  w.slot_of = reinterpret_cast<int*>(base + l.slot_of);
  w.owner = reinterpret_cast<int*>(base + l.owner);
  w.stamps = reinterpret_cast<int*>(base + l.stamps);
  w.clock = reinterpret_cast<unsigned*>(base + l.clock);
  w.copies = reinterpret_cast<int*>(base + l.copies);
  w.n_copies = reinterpret_cast<int*>(base + l.n_copies);
  w.fetched_bytes = reinterpret_cast<unsigned long long*>(base + l.fetched_bytes);
  return w;
}

// Nothing resident: every block's slot -1, every slot free with stamp 0. Sessions call it at creation and after
// anything but the fills writes the host copy (the prompt path, after every chunk), so fetched_bytes is left as
// it is: the session's counter runs from its arena's reset, which zeroes it.
cudaError_t kv_window_reset(const KvWindow& w, cudaStream_t stream);

// Slots are evicted oldest stamp first, ties to the lowest slot; a free slot's stamp is 0. Each token's claim
// advances the clock (c = *clock + 1), and the token stamps what it needs with c.

// Before attention_prep writes row p = *position: block b = p / ratio made resident, if it is not, in the oldest
// slot, with its rows before p copied from the host (rows from p on are written by this token and the next
// ones). Advances the clock to c and stamps b's slot c.
cudaError_t kv_window_claim(const KvWindow& w, const int* position, cudaStream_t stream);

// After qsa_select: (a) row p (every kv head, both halves, codes and scales) copied from the window back to the
// host copy; (b) every block the token needs resident: the first min(*n_selected, keep_blocks) of
// selected_blocks (ascending, distinct) and p / ratio. Needed blocks already resident stay where they are and
// are stamped c (the claim's clock); each missing one, in that order, takes the next of the slots this token does
// not need (stamp != c), oldest first, is stamped c and copied from the host, its bytes added to *fetched_bytes.
// A token needs at most keep_blocks + 1 blocks; with keep_blocks + 2 slots the claim of the next token also finds
// a slot this token did not need, so a selection that repeats fetches nothing. Refuses a window of fewer slots.
cudaError_t kv_window_fill(const KvWindow& w, const int* selected_blocks, const int* n_selected, const int* position,
                           cudaStream_t stream);

}  // namespace strata::kernels
