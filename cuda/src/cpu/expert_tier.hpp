// The disk tier inside the pool (docs/tiers.md): a tiered layer's arena of resident experts and its policy
// (TieredLayer), and what every tiered layer shares (DiskTier): the file, its I/O threads and the staging, two
// halves of slots that a call's misses are read into. A decode call reads its misses into one half; a grouped
// call (a prompt chunk) goes in waves of at most a half's misses, the next wave's reads in flight in the other
// half while one computes; each missed expert is read once per call whatever its rows.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "block_repack.hpp"
#include "expert_load.hpp"
#include "host_region.hpp"
#include "io_queue.hpp"
#include "strata/expert_policy.hpp"
#include "strata/expert_pool.hpp"

namespace strata::cpu {

constexpr int kMatrices = 3;  // gate, up, down
extern const char* const kMatrixNames[kMatrices];

// One expert's canonical planes in a slot (of an arena or of the staging): gate, up and down one after another,
// every plane at a 64-byte boundary, as read_expert hands them out too (less the padding).
struct SlotLayout {
  struct Planes {
    PlaneBytes bytes;
    std::int64_t codes = 0, d = 0, sub_scales = 0, mins = 0, sub_mins = 0;  // offsets in the slot
  };
  Planes matrix[kMatrices];
  std::int64_t bytes = 0;

  static SlotLayout of(const ExpertMatrix* const matrices[kMatrices]);
  MatrixRows rows(const std::uint8_t* slot, int m, const ExpertMatrix& matrix) const;
  PlaneTargets targets(std::uint8_t* slot, int m) const;
};

// A tiered layer: `slots` experts in its page-locked arena, the rest in the file; the arena follows the decode
// calls' routing through a ReplacementPolicy of its own (one layer of it, one "token" per call).
struct TieredLayer {
  TieredLayer(int layer, const ExpertMatrix* const matrices[kMatrices], const FileMatrix* const files[kMatrices],
              int slots, const TierPolicy& policy);

  int layer;
  int n_expert;
  int slots;
  FileMatrix file[kMatrices];
  std::int64_t n_blocks[kMatrices];  // per expert
  std::int64_t length[kMatrices];    // file bytes per expert
  SlotLayout layout;
  HostRegion arena;
  ReplacementPolicy policy;
  std::int64_t hits = 0, misses = 0, moves = 0, bytes_read = 0;

  std::uint8_t* slot(int s) const { return arena.data() + s * layout.bytes; }
  ExpertRef in_arena(int s, const ExpertMatrix* const matrices[kMatrices]) const;
  std::int64_t bounce_bytes() const;  // the staging's bounce for one expert's reads
  std::int64_t file_bytes() const;    // one expert's bytes in the file
};

// What a tiered layer of these matrices takes (ExpertPool::tier_sizes), validated as TieredLayer validates them.
TierSizes tier_sizes(int layer, const ExpertMatrix* const matrices[kMatrices],
                     const FileMatrix* const files[kMatrices]);

class DiskTier {
 public:
  // `half_slots` experts per half of the staging; `io_threads` reading threads.
  DiskTier(std::unique_ptr<FileReader> file, int io_threads, int half_slots);
  ~DiskTier();

  const FileReader& file() const noexcept { return *file_; }
  int half_slots() const noexcept { return half_slots_; }
  int io_threads() const noexcept { return queue_.threads(); }
  std::int64_t staging_bytes() const noexcept { return static_cast<std::int64_t>(staging_.bytes()); }
  bool staging_locked() const noexcept { return staging_.locked(); }

  // Makes the staging's slots hold an expert of `layer` (regrown, before any call reads through it).
  void reserve(const TieredLayer& layer);

  // Starts reading expert `expert` of `layer` through the next free slot of staging half `half`, into `dst` (an
  // arena slot of the layer) or, when null, that staging slot; the ref's loads say when each matrix is in.
  ExpertRef load(TieredLayer& layer, int expert, const ExpertMatrix* const matrices[kMatrices], int half,
                 std::uint8_t* dst);

  // Waits until every load of half `half` is done with, and frees its slots. Throws the first failed read (and
  // every call after it: a failed read leaves the tier unusable) and FormatError when the file changed under the
  // reads.
  void settle(int half);

  // settle without throwing, for a call that is already failing: a failed read still breaks the tier.
  void drain(int half) noexcept;

  // Throws the failure that broke the tier, if one did.
  void check_usable() const;

 private:
  std::unique_ptr<FileReader> file_;
  int half_slots_;
  std::int64_t slot_bytes_ = 0, bounce_bytes_ = 0;  // per staging slot
  HostRegion staging_;  // [2 * half_slots] of (slot_bytes_ canonical + bounce_bytes_ bounce)
  std::vector<MatrixLoad> loads_;  // [2 * half_slots][kMatrices]
  int used_[2] = {0, 0};           // slots of each half taken since its last settle
  std::exception_ptr broken_;
  IoQueue queue_;  // last: its threads stop (and finish their reads) before the loads and staging go
};

}  // namespace strata::cpu
