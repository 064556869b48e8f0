// The disk tier's repack: blocks of a file's expert tensor into the planes of their canonical form (docs/forms.md,
// "From GGUF types"), bit for bit what strata.quant.repack makes of the same bytes (tests/pool/test_pool_tiers.py
// holds every type to it). Python repacks what it loads itself; the pool repacks what it reads from the file
// while a token runs.
#pragma once

#include <cstdint>

#include "strata/expert_tiers.hpp"
#include "strata/forms.hpp"

namespace strata::cpu {

// Where one matrix's canonical planes go (a plane the form lacks: nullptr).
struct PlaneTargets {
  std::uint8_t* codes = nullptr;
  std::uint8_t* d = nullptr;
  std::uint8_t* sub_scales = nullptr;
  std::uint8_t* mins = nullptr;
  std::uint8_t* sub_mins = nullptr;
};

// A block type's block: its elements, its bytes in the file, and what it fills of each plane.
struct BlockLayout {
  int elements = 0;
  int bytes = 0;
  PlaneBytes planes;  // per block
};

// The layout of `type`; InvalidArgument naming `what` for a type the pool does not repack.
BlockLayout block_layout(BlockType type, const char* what);

// Repacks blocks first .. first + count - 1 of the `type` blocks at `src` into their places of `dst` (each plane
// the whole matrix's, from block 0): each block alone, so that several threads may take a matrix's blocks in runs.
void repack_blocks(BlockType type, const std::uint8_t* src, std::int64_t first, std::int64_t count,
                   const PlaneTargets& dst);

}  // namespace strata::cpu
