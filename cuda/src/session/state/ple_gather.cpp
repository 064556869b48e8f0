#include "strata/ple_gather.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "strata/error.hpp"

namespace strata {
namespace {

constexpr int kQ8Block = 32;  // Q8_0: an f16 scale, then 32 int8 codes
constexpr std::size_t kQ8BlockBytes = 2 + kQ8Block;

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // rows of a mapped file carry no alignment promise
  return v;
}

float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE half to float, exactly (every half is a float); NaN payloads kept as numpy keeps them. In software: the
// core stays generic x86-64 outside the pool's ISA-flagged kernels (cuda/src/cpu/CMakeLists.txt).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return from_bits(sign);
  std::uint32_t biased = 113;  // a subnormal m * 2^-24, normalised: shift until the implicit bit appears
  while (!(mantissa & 0x400u)) {
    mantissa <<= 1;
    --biased;
  }
  return from_bits(sign | (biased << 23) | ((mantissa & 0x3ffu) << 13));
}

std::size_t row_bytes_of(PleRowType type, int head_dim) {
  const auto n = static_cast<std::size_t>(head_dim);
  switch (type) {
    case PleRowType::F32: return 4 * n;
    case PleRowType::F16:
    case PleRowType::BF16: return 2 * n;
    case PleRowType::Q8_0: return n / kQ8Block * kQ8BlockBytes;
  }
  throw InvalidArgument("per_layer_token_embd.weight: unknown row type " + std::to_string(static_cast<int>(type)));
}

// The table's own fields, before the hash's (so a file whose table and hash are both off names the table first).
const PleTable& checked(const PleTable& t) {
  const std::string table = "per_layer_token_embd.weight: ";
  STRATA_EXPECTS(t.rows != nullptr && t.head_dim >= 1, InvalidArgument,
                 table + "no rows to read (" + std::to_string(t.head_dim) + " values a row)");
  STRATA_EXPECTS(t.row_type != PleRowType::Q8_0 || t.head_dim % kQ8Block == 0, InvalidArgument,
                 table + "Q8_0 rows of " + std::to_string(t.head_dim) + " values are not whole 32-value blocks");
  const std::size_t expected = row_bytes_of(t.row_type, t.head_dim);
  STRATA_EXPECTS(t.rows->row_bytes() == expected, InvalidArgument,
                 table + "rows of " + std::to_string(t.rows->row_bytes()) + " bytes; " + std::to_string(t.head_dim) +
                     " values of its type take " + std::to_string(expected));
  return t;
}

void check_hash(const PleHash& h) {
  STRATA_EXPECTS(h.ngram >= 2 && h.heads_per_ngram >= 1, InvalidArgument,
                 "ple: ngram_size " + std::to_string(h.ngram) + " and heads_per_ngram " +
                     std::to_string(h.heads_per_ngram) + "; a table gather needs ngram >= 2 and one head or more");
  STRATA_EXPECTS(static_cast<int>(h.multipliers.size()) == h.ngram, InvalidArgument,
                 "ple.layer_multipliers: " + std::to_string(h.multipliers.size()) + " values for ngram_size " +
                     std::to_string(h.ngram));
  const std::size_t heads = static_cast<std::size_t>(h.ngram - 1) * h.heads_per_ngram;
  STRATA_EXPECTS(h.head_sizes.size() == heads && h.head_offsets.size() == heads, InvalidArgument,
                 "ple.head_vocab_sizes / head_offsets: " + std::to_string(h.head_sizes.size()) + " / " +
                     std::to_string(h.head_offsets.size()) + " values, expected " + std::to_string(heads));
  for (std::size_t i = 0; i < heads; ++i) {
    STRATA_EXPECTS(h.head_sizes[i] >= 1, InvalidArgument,
                   "ple.head_vocab_sizes: head " + std::to_string(i) + " has no rows");
  }
}

// Every head's rows inside the table.
void check_reach(const PleTable& t, const PleHash& h) {
  const std::string table = "per_layer_token_embd.weight: ";
  const auto rows = static_cast<std::uint64_t>(t.rows->rows());
  for (std::size_t i = 0; i < h.head_sizes.size(); ++i) {
    const std::uint64_t size = h.head_sizes[i], offset = h.head_offsets[i];
    STRATA_EXPECTS(offset <= rows && size <= rows - offset, InvalidArgument,
                   table + "head " + std::to_string(i) + " reads rows " + std::to_string(offset) + " + [0, " +
                       std::to_string(size) + "), past the table's " + std::to_string(rows) + " rows");
  }
}

}  // namespace

PleNgrams::PleNgrams(PleHash hash) : hash_(std::move(hash)) {
  check_hash(hash_);
  reset();
}

void PleNgrams::reset() { previous_.assign(hash_.ngram - 1, hash_.eos); }

void PleNgrams::set_previous(const std::vector<std::int64_t>& ids) {
  STRATA_EXPECTS(ids.size() == previous_.size(), InvalidArgument,
                 "ple: " + std::to_string(ids.size()) + " previous ids given, the n-gram context keeps " +
                     std::to_string(previous_.size()));
  previous_ = ids;
}

void PleNgrams::next(std::int64_t token, std::uint64_t* rows) {
  const int back = hash_.ngram - 1;
  // c0 = token, c_s = the id s places before it; from the nearest EOS predecessor on, every c_s reads as EOS
  // (a token's own EOS cuts nothing). Products wrap modulo 2^64, as the reference's masked ints do.
  std::uint64_t mixed = static_cast<std::uint64_t>(token) * hash_.multipliers[0];
  bool cut = false;
  int head = 0;
  for (int s = 1; s <= back; ++s) {
    const std::int64_t before = previous_[back - s];
    cut = cut || before == hash_.eos;
    mixed ^= static_cast<std::uint64_t>(cut ? hash_.eos : before) * hash_.multipliers[s];
    for (int j = 0; j < hash_.heads_per_ngram; ++j, ++head) {
      rows[head] = mixed % hash_.head_sizes[head] + hash_.head_offsets[head];
    }
  }
  std::copy(previous_.begin() + 1, previous_.end(), previous_.begin());
  previous_.back() = token;
}

PleGather::PleGather(const PleTable& table, PleHash hash)
    : table_(checked(table)), ngrams_(std::move(hash)), rows_(ngrams_.n_heads()), kept_(ngrams_.previous()) {
  check_reach(table_, ngrams_.hash());
}

void PleGather::rows(std::int64_t token, float* out) {
  kept_ = ngrams_.previous();  // the ids before, back where a read fails (the same size: no allocation)
  ngrams_.next(token, rows_.data());
  try {
    for (int head = 0; head < n_heads(); ++head) widen(rows_[head], out + static_cast<std::size_t>(head) * head_dim());
    table_.rows->check_read();
  } catch (...) {
    ngrams_.set_previous(kept_);
    throw;
  }
}

// Row `row` as float32, as strata.quant.dequantize gives it: Q8_0 as float(d) * float(code), one rounding.
void PleGather::widen(std::uint64_t row, float* out) const {
  const unsigned char* p = table_.rows->row(static_cast<std::int64_t>(row));
  const int n = table_.head_dim;
  switch (table_.row_type) {
    case PleRowType::F32:
      std::memcpy(out, p, sizeof(float) * n);
      return;
    case PleRowType::F16:
      for (int i = 0; i < n; ++i) out[i] = half_to_float(load<std::uint16_t>(p + 2 * i));
      return;
    case PleRowType::BF16:
      for (int i = 0; i < n; ++i) out[i] = from_bits(static_cast<std::uint32_t>(load<std::uint16_t>(p + 2 * i)) << 16);
      return;
    case PleRowType::Q8_0:
      for (int b = 0; b < n / kQ8Block; ++b, p += kQ8BlockBytes) {
        const float d = half_to_float(load<std::uint16_t>(p));
        float* values = out + b * kQ8Block;
        for (int i = 0; i < kQ8Block; ++i) values[i] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + i]));
      }
      return;
  }
}

}  // namespace strata
