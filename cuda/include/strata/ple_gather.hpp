// The PLE layer's n-gram table rows of each new token, gathered on the host (docs/models/qwen4exp.md §3(d)):
// strata.reference.ple's hash over the last ngram-1 ids (EOS-cut), the rows read from the file as they are needed
// (strata/file_rows.hpp: the table never needs RAM) and widened to float32, bit for bit as
// strata.runtime.ple_rows.PleRows gives them. The decode session runs it
// on its host loop while the GPU works on the layers below the PLE layer (docs/session.md). PleNgrams is the
// runtime's one copy of the hash: PleGather reads its rows by it, and PleRows (the table types read in Python)
// takes its row indices from it. Host-only header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/file_rows.hpp"

namespace strata {

// How per_layer_token_embd stores its rows: the types a converter writes for it (any other type stays on the
// Python path, strata.runtime.ple_rows).
enum class PleRowType : int { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

// The n-gram table in the file: its rows, each `head_dim` values of `row_type`, read through `rows`.
struct PleTable {
  FileRows* rows = nullptr;
  int head_dim = 0;
  PleRowType row_type = PleRowType::F32;
};

// strata.models.PleShape's hash: order k = 2..ngram mixes the ids c0..c_{k-1} (XOR of c_s * multipliers[s],
// modulo 2^64) and its heads_per_ngram heads read row mixed % head_sizes[h] + head_offsets[h].
struct PleHash {
  int ngram = 0, heads_per_ngram = 0;
  std::int64_t eos = 0;
  std::vector<std::uint64_t> multipliers;               // [ngram]
  std::vector<std::uint64_t> head_sizes, head_offsets;  // [(ngram - 1) * heads_per_ngram]
};

// A sequence's n-gram state under a hash: the last ngram-1 ids (EOS before the sequence) and the table rows of
// each token appended to it.
class PleNgrams {
 public:
  // Throws InvalidArgument naming the field of `hash` that is off (ngram, multipliers, heads, a head of 0 rows).
  explicit PleNgrams(PleHash hash);

  int n_heads() const noexcept { return static_cast<int>(hash_.head_sizes.size()); }
  const PleHash& hash() const noexcept { return hash_; }

  // The table rows of `token` appended after the ids seen so far, which it then joins: n_heads() row indices
  // into `rows`. Allocates nothing: it runs on the host loop.
  void next(std::int64_t token, std::uint64_t* rows);

  // An empty sequence: the ids before it read as EOS.
  void reset();

  // The last ngram-1 ids, oldest first: what a state snapshot keeps; set_previous takes ngram-1 of them back.
  const std::vector<std::int64_t>& previous() const noexcept { return previous_; }
  void set_previous(const std::vector<std::int64_t>& ids);

 private:
  PleHash hash_;
  std::vector<std::int64_t> previous_;
};

class PleGather {
 public:
  // Throws InvalidArgument naming the field where the hash and the table disagree (a head reaching past the
  // table's rows, a row that is not head_dim values of its type). `table.rows` must outlive the gather.
  PleGather(const PleTable& table, PleHash hash);

  int n_heads() const noexcept { return ngrams_.n_heads(); }
  int head_dim() const noexcept { return table_.head_dim; }
  int width() const noexcept { return n_heads() * head_dim(); }

  // The rows of `token` appended after the ids seen so far, which it then joins: float32 [n_heads][head_dim]
  // into `out`. Allocates nothing: it runs on the host loop. Throws FormatError (the ids unchanged) when the file
  // ended before a row or changed since it was opened.
  void rows(std::int64_t token, float* out);

  // An empty sequence: the ids before it read as EOS.
  void reset() { ngrams_.reset(); }

  // The last ngram-1 ids, oldest first: what a state snapshot keeps; set_previous takes ngram-1 of them back.
  const std::vector<std::int64_t>& previous() const noexcept { return ngrams_.previous(); }
  void set_previous(const std::vector<std::int64_t>& ids) { ngrams_.set_previous(ids); }

 private:
  void widen(std::uint64_t row, float* out) const;

  PleTable table_;
  PleNgrams ngrams_;
  std::vector<std::uint64_t> rows_;  // the token's row indices, sized once
  std::vector<std::int64_t> kept_;   // the ids before the token being gathered, sized once
};

}  // namespace strata
