#include "expert_tier.hpp"

#include <algorithm>
#include <string>

#include "expert_layout.hpp"
#include "strata/error.hpp"

namespace strata::cpu {
namespace {

constexpr std::int64_t kPlaneAlign = 64;

std::string str(std::int64_t v) { return std::to_string(v); }

std::int64_t aligned(std::int64_t v, std::int64_t to) { return (v + to - 1) / to * to; }

PolicyOptions policy_options(const TierPolicy& p) {
  PolicyOptions o;
  o.replace = p.replace;
  o.admit_after = p.admit_after;
  o.window = p.window;
  o.max_copies = p.max_moves;
  return o;
}

// The float kind a float block type holds (the pool's FloatKind), or -1 for a quantized type.
int float_kind_of(BlockType type) {
  switch (type) {
    case BlockType::F32: return static_cast<int>(FloatKind::F32);
    case BlockType::F16: return static_cast<int>(FloatKind::F16);
    case BlockType::BF16: return static_cast<int>(FloatKind::BF16);
    default: return -1;
  }
}

// The matrix's file blocks repack into exactly its planes: same float kind, or each plane a whole number of the
// block type's entries.
void check_blocks(const ExpertMatrix& m, const FileMatrix& f, const BlockLayout& b, const std::string& what) {
  const int kind = float_kind_of(f.type);
  STRATA_EXPECTS(m.is_float == (kind >= 0) && (!m.is_float || kind == static_cast<int>(m.float_kind)),
                 InvalidArgument, what + ": the file's ggml type " + str(static_cast<int>(f.type)) +
                                      " does not hold the matrix's canonical form");
  const std::int64_t elements = m.rows * m.cols;
  STRATA_EXPECTS(elements % b.elements == 0, InvalidArgument,
                 what + ": " + str(elements) + " elements are not whole blocks of " + str(b.elements));
  const std::int64_t n = elements / b.elements;
  const PlaneBytes p = expert_plane_bytes(m);
  const bool same = p.codes == n * b.planes.codes && p.d == n * b.planes.d &&
                    p.sub_scales == n * b.planes.sub_scales && p.mins == n * b.planes.mins &&
                    p.sub_mins == n * b.planes.sub_mins;
  STRATA_EXPECTS(same, InvalidArgument,
                 what + ": the file's ggml type " + str(static_cast<int>(f.type)) +
                     " does not repack into the matrix's canonical form (its planes differ)");
  STRATA_EXPECTS(f.offset >= 0 && f.expert_stride >= n * b.bytes, InvalidArgument,
                 what + ": file offset " + str(f.offset) + " and expert stride " + str(f.expert_stride) +
                     " do not hold an expert's " + str(n * b.bytes) + " bytes");
}

}  // namespace

const char* const kMatrixNames[kMatrices] = {"gate", "up", "down"};

SlotLayout SlotLayout::of(const ExpertMatrix* const matrices[kMatrices]) {
  SlotLayout s;
  std::int64_t at = 0;
  auto place = [&at](std::size_t bytes) {
    const std::int64_t offset = at;
    at += aligned(static_cast<std::int64_t>(bytes), kPlaneAlign);
    return offset;
  };
  for (int m = 0; m < kMatrices; ++m) {
    Planes& p = s.matrix[m];
    p.bytes = expert_plane_bytes(*matrices[m]);
    p.codes = place(p.bytes.codes);
    p.d = place(p.bytes.d);
    p.sub_scales = place(p.bytes.sub_scales);
    p.mins = place(p.bytes.mins);
    p.sub_mins = place(p.bytes.sub_mins);
  }
  s.bytes = aligned(at, FileReader::kAlign);
  return s;
}

MatrixRows SlotLayout::rows(const std::uint8_t* slot, int m, const ExpertMatrix& matrix) const {
  const Planes& p = this->matrix[m];
  MatrixRows r;
  r.form = &matrix.form;
  r.cols = matrix.cols;
  r.codes = slot + p.codes;
  r.d = p.bytes.d ? slot + p.d : nullptr;
  r.sub_scales = p.bytes.sub_scales ? reinterpret_cast<const int8_t*>(slot + p.sub_scales) : nullptr;
  r.mins = p.bytes.mins ? reinterpret_cast<const uint16_t*>(slot + p.mins) : nullptr;
  r.sub_mins = p.bytes.sub_mins ? slot + p.sub_mins : nullptr;
  return r;
}

PlaneTargets SlotLayout::targets(std::uint8_t* slot, int m) const {
  const Planes& p = matrix[m];
  return {slot + p.codes, p.bytes.d ? slot + p.d : nullptr, p.bytes.sub_scales ? slot + p.sub_scales : nullptr,
          p.bytes.mins ? slot + p.mins : nullptr, p.bytes.sub_mins ? slot + p.sub_mins : nullptr};
}

namespace {

// Validates each matrix's file blocks against its form (check_blocks) and gives its blocks and file bytes per
// expert.
void file_extents(int layer, const ExpertMatrix* const matrices[kMatrices], const FileMatrix* const files[kMatrices],
                  std::int64_t n_blocks[kMatrices], std::int64_t length[kMatrices]) {
  for (int m = 0; m < kMatrices; ++m) {
    const std::string what = "layer " + str(layer) + " " + kMatrixNames[m];
    const BlockLayout b = block_layout(files[m]->type, what.c_str());
    check_blocks(*matrices[m], *files[m], b, what);
    n_blocks[m] = matrices[m]->rows * matrices[m]->cols / b.elements;
    length[m] = n_blocks[m] * b.bytes;
  }
}

std::int64_t bounce_of(const std::int64_t length[kMatrices]) {
  std::int64_t total = 0;
  for (int m = 0; m < kMatrices; ++m) total += FileReader::bounce_bytes(length[m]);
  return total;
}

}  // namespace

TierSizes tier_sizes(int layer, const ExpertMatrix* const matrices[kMatrices],
                     const FileMatrix* const files[kMatrices]) {
  std::int64_t n_blocks[kMatrices], length[kMatrices];
  file_extents(layer, matrices, files, n_blocks, length);
  return {SlotLayout::of(matrices).bytes, bounce_of(length)};
}

TieredLayer::TieredLayer(int layer_, const ExpertMatrix* const matrices[kMatrices],
                         const FileMatrix* const files[kMatrices], int slots_, const TierPolicy& p)
    : layer(layer_), n_expert(static_cast<int>(matrices[0]->n_expert)), slots(slots_),
      layout(SlotLayout::of(matrices)),
      policy({slots_}, static_cast<int>(matrices[0]->n_expert), policy_options(p)) {
  STRATA_EXPECTS(slots >= 0 && slots <= n_expert, InvalidArgument,
                 "layer " + str(layer) + ": slots must be in 0.." + str(n_expert) + " (its experts), found " +
                     str(slots));
  file_extents(layer, matrices, files, n_blocks, length);
  for (int m = 0; m < kMatrices; ++m) file[m] = *files[m];
  arena = HostRegion(static_cast<std::size_t>(slots) * layout.bytes, ("layer " + str(layer) + " expert arena").c_str());
}

ExpertRef TieredLayer::in_arena(int s, const ExpertMatrix* const matrices[kMatrices]) const {
  const std::uint8_t* base = slot(s);
  ExpertRef r;
  r.gate = layout.rows(base, 0, *matrices[0]);
  r.up = layout.rows(base, 1, *matrices[1]);
  r.down = layout.rows(base, 2, *matrices[2]);
  return r;
}

std::int64_t TieredLayer::bounce_bytes() const { return bounce_of(length); }

std::int64_t TieredLayer::file_bytes() const { return length[0] + length[1] + length[2]; }

DiskTier::DiskTier(std::unique_ptr<FileReader> file, int io_threads, int half_slots)
    : file_(std::move(file)), half_slots_(half_slots), loads_(static_cast<std::size_t>(2 * half_slots) * kMatrices),
      queue_(io_threads, 2 * half_slots * kMatrices * MatrixLoad::kMaxPieces) {
  STRATA_EXPECTS(half_slots >= 1, InvalidArgument,
                 "expert file: staging_slots must be >= 1, found " + str(half_slots));
}

DiskTier::~DiskTier() = default;

void DiskTier::reserve(const TieredLayer& layer) {
  const std::int64_t slot = std::max(slot_bytes_, layer.layout.bytes);
  const std::int64_t bounce = std::max(bounce_bytes_, aligned(layer.bounce_bytes(), FileReader::kAlign));
  if (slot == slot_bytes_ && bounce == bounce_bytes_) return;
  STRATA_EXPECTS(used_[0] == 0 && used_[1] == 0, InvalidArgument,
                 "expert file: the staging cannot grow while reads are in flight");
  staging_ = HostRegion(static_cast<std::size_t>(2 * half_slots_) * (slot + bounce), "the disk tier's staging");
  slot_bytes_ = slot;
  bounce_bytes_ = bounce;
}

ExpertRef DiskTier::load(TieredLayer& layer, int expert, const ExpertMatrix* const matrices[kMatrices], int half,
                         std::uint8_t* dst) {
  check_usable();
  STRATA_EXPECTS(used_[half] < half_slots_, InvalidArgument,
                 "expert file: a call needs more than the staging's " + str(half_slots_) + " slots of misses");
  const int s = half * half_slots_ + used_[half]++;
  std::uint8_t* base = staging_.data() + s * (slot_bytes_ + bounce_bytes_);
  std::uint8_t* planes = dst != nullptr ? dst : base;
  std::uint8_t* bounce = base + slot_bytes_;
  ExpertRef r;
  MatrixRows* rows[kMatrices] = {&r.gate, &r.up, &r.down};
  MatrixLoad** waits[kMatrices] = {&r.gate_load, &r.up_load, &r.down_load};
  for (int m = 0; m < kMatrices; ++m) {
    MatrixLoad& load = loads_[s * kMatrices + m];
    const FileMatrix& f = layer.file[m];
    const int pieces = load.start(file_.get(), f.offset + expert * f.expert_stride, layer.length[m], bounce, f.type,
                                  layer.n_blocks[m], layer.layout.targets(planes, m), layer.layer, expert,
                                  kMatrixNames[m]);
    *rows[m] = layer.layout.rows(planes, m, *matrices[m]);
    *waits[m] = &load;
    bounce += FileReader::bounce_bytes(layer.length[m]);
    for (int i = 0; i < pieces; ++i) queue_.submit(load.piece(i));
  }
  return r;
}

void DiskTier::drain(int half) noexcept {
  for (int s = half * half_slots_; s < half * half_slots_ + used_[half]; ++s) {
    for (int m = 0; m < kMatrices; ++m) {
      MatrixLoad& load = loads_[s * kMatrices + m];
      if (!load.settle() && !broken_) broken_ = load.error();
    }
  }
  used_[half] = 0;
}

void DiskTier::settle(int half) {
  const bool read = used_[half] > 0;
  drain(half);
  check_usable();
  if (read) {
    try {
      file_->check_unchanged();
    } catch (...) {
      broken_ = std::current_exception();
      throw;
    }
  }
}

void DiskTier::check_usable() const {
  if (broken_) std::rethrow_exception(broken_);
}

}  // namespace strata::cpu
