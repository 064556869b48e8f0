// The CPU expert pool: pinned workers that compute the routed experts of one MoE layer, streaming the
// expert weights (canonical forms, docs/forms.md: float or quantized, any mix within a layer) at the machine's
// memory bandwidth. A layer's experts are all in host RAM (set_layer), or tiered (set_tiered_layer): some in the
// pool's page-locked arena, the rest read from the model file while the pool computes (docs/tiers.md). Host-only,
// no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/expert_tiers.hpp"
#include "strata/forms.hpp"

namespace strata::cpu {

enum class Isa : int { kAuto = 0, kAvx2 = 1, kAvx512 = 2 };

// Whether this CPU (and OS) runs the AVX-512 VNNI kernels / the AVX2+FMA+F16C kernels.
bool cpu_has_avx512_vnni();
bool cpu_has_avx2();
// The ISA the pool uses for `requested`: kAuto reads env STRATA_CPU_ISA (avx2|avx512), else the best the
// CPU has. Throws InvalidArgument when the requested ISA is missing on this CPU or the env value is unknown.
Isa resolve_isa(Isa requested);
const char* isa_name(Isa isa);

// One plane: base pointer and its size in bytes (validated against the form and shape).
struct Plane {
  const void* data = nullptr;
  int64_t nbytes = 0;
};

// n_expert matrices of rows x cols each, one form, planes [expert][row][...] (each expert's rows contiguous).
// A float matrix (is_float) keeps its float_kind elements row-major in `codes`, takes x and h as float32 and
// has no other plane (`form` unused); a quantized one has the planes of `form` and takes them as q8_32.
struct ExpertMatrix {
  bool is_float = false;
  FloatKind float_kind = FloatKind::F32;
  QuantForm form;
  int64_t n_expert = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  Plane codes, d, sub_scales, mins, sub_mins;
};

// One layer's registered weights (the pool's pointers into the caller's planes).
struct LayerMatrices {
  ExpertMatrix gate, up, down;
};

struct PoolOptions {
  int threads = 0;        // 0: one worker per physical core except the first (all cores if there is one)
  bool smt = false;       // also run a worker on every SMT sibling of the worker cores
  bool pin_caller = true; // pin the constructing thread to the first physical core; restored by close()
  Isa isa = Isa::kAuto;
  int spin_us = 3000;     // idle workers spin this long after a job, then park (no CPU while idle)
  int max_rows = 0;       // rows run_groups takes per call, its scratch allocated at construction (0: none)
};

// The model file of the disk tier (open_expert_file).
struct ExpertFileOptions {
  bool direct = true;     // O_DIRECT where the file system takes it; else buffered reads, their pages dropped
  int io_threads = 8;     // threads reading (the reads in flight)
  int staging_slots = 0;  // experts per half of the staging: the misses a decode call and a grouped wave may
                          // have (0: max_k)
};

// What the disk tier holds and has read (expert_file_info).
struct ExpertFileInfo {
  std::string path;
  bool direct = false;
  std::string buffered_reason;  // why reads are not O_DIRECT ("" when they are)
  int io_threads = 0;
  int staging_slots = 0;
  std::int64_t staging_bytes = 0;  // page-locked where staging_locked
  bool staging_locked = false;
  std::int64_t arena_bytes = 0;    // every tiered layer's arena, page-locked where arenas_locked
  bool arenas_locked = true;
  std::int64_t bytes_read = 0;     // file bytes read so far (O_DIRECT's aligned spans)
};

// A tiered layer's sizes, before anything is allocated: one expert in an arena slot (its canonical planes, each
// 64-byte aligned) and the bounce its reads take in a staging slot (ExpertPool::tier_sizes).
struct TierSizes {
  std::int64_t slot_bytes = 0;
  std::int64_t bounce_bytes = 0;
};

class ExpertPool {
 public:
  ExpertPool(int64_t n_embd, int64_t expert_ff, int max_k, const PoolOptions& options);
  ~ExpertPool();
  ExpertPool(const ExpertPool&) = delete;
  ExpertPool& operator=(const ExpertPool&) = delete;

  // Registers layer `layer`'s gate, up (expert_ff x n_embd) and down (n_embd x expert_ff) weights. The pool
  // keeps the pointers, not the data: the caller keeps the planes alive until close(). Throws
  // InvalidArgument naming the layer, matrix and limit on any size mismatch.
  void set_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down);

  // Opens the model file for the tiered layers: once, before the first set_tiered_layer. Throws FormatError
  // naming the file when it cannot be opened.
  void open_expert_file(const std::string& path, const ExpertFileOptions& options);

  // Registers layer `layer` as tiered: gate, up and down give the form, n_expert and shape of its matrices (no
  // planes), files where each expert's matrices lie in the open file. `slots` experts fit in the layer's arena,
  // which starts with `hold` (at most `slots` distinct experts, read here by the I/O threads and repacked by the
  // workers) and then follows the decode calls' routing as `policy` says. Nothing is registered when it throws:
  // InvalidArgument naming the layer and matrix (a shape, a type the pool does not repack, a file range that
  // cannot hold the matrix), FormatError naming the file, offset, layer and expert of a read that failed.
  void set_tiered_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                        const FileMatrix& gate_file, const FileMatrix& up_file, const FileMatrix& down_file, int slots,
                        const std::vector<int>& hold, const TierPolicy& policy);

  // The sizes a tiered layer of these matrices takes (validated as set_tiered_layer validates them).
  static TierSizes tier_sizes(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                              const FileMatrix& gate_file, const FileMatrix& up_file, const FileMatrix& down_file);

  bool is_tiered(int layer) const;
  std::vector<TierLayerStats> tier_stats() const;  // every tiered layer, in layer order
  ExpertFileInfo expert_file_info() const;         // InvalidArgument when no file is open

  // One expert's canonical planes wherever it lives (planes, arena or file): gate, up, then down, each plane
  // that its form has in the order codes, d, sub_scales, mins, sub_mins, packed, into `out` of expert_bytes(layer)
  // bytes. What the tier's reads repack is held to strata.quant.repack through it.
  std::int64_t expert_bytes(int layer) const;
  void read_expert(int layer, int expert, std::uint8_t* out);

  // out[j][:] = weights[j] * down(silu(gate x) * up x) for expert ids[j], j < k, except where skip[j] != 0
  // (those rows of out are not written). x: n_embd floats; out: k * n_embd floats. Blocking; allocates
  // nothing (a tiered layer: its policy's list of moves, when there are some). skip may be null. On a tiered
  // layer the experts in its arena are computed while its misses arrive from the file, each read once; a read
  // that fails, or a file changed under the reads, throws (out is then undefined), and so does every call after.
  void run_layer(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip, int k,
                 float* out);

  // out[:] = the sum over j < k with skip[j] == 0 (null skip: every j) of run_layer's row j, added in order of j
  // from zero, bit for bit; zeros when every j is skipped. out: n_embd floats. The decode loop's job: the
  // participants add the rows up a range at a time as the ranges complete, so nothing sums k rows after the job.
  void run_layer_sum(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip, int k,
                     float* out);

  // The routed experts of a prompt chunk, grouped by expert: for g < groups, rows begin[g] .. begin[g+1]-1 of x
  // (n_embd floats each, row-major, the groups' rows consecutive from row 0) go through expert experts[g] of
  // `layer`: out row r = down(silu(gate x_r) * up x_r), UNWEIGHTED (n_embd floats, row-major, one per row of x).
  // Each row is computed as run_layer computes one token's expert (the same q8_32 of x and h, the same kernels):
  // it equals run_layer's row for that token and expert with weight 1, bit for bit. Each expert's weights are
  // streamed about once per call, not once per row. begin has groups + 1 entries, begin[0] = 0, non-decreasing,
  // begin[groups] <= PoolOptions::max_rows; a group may be empty. Blocking; allocates nothing (past the largest
  // number of groups seen so far). On a tiered layer the groups go in waves of at most staging_slots misses, the
  // next wave's reads in flight while one computes; the arena does not move for them. Errors as run_layer's.
  void run_groups(int layer, const float* x, const int32_t* experts, const int* begin, int groups, float* out);

  // The routed experts of `rows` rows at once: out[r] = run_layer_sum(layer, x[r], ids[r], weights[r], skip[r], k)
  // for r < rows, bit for bit, each expert that rows route to computed once for all of them (run_groups: the rows'
  // routed pairs count against max_rows). x, out [rows][n_embd]; ids, weights, skip [rows][k]; skip may be null.
  // A step of several rows answers the routed experts the VRAM cache lacks with it. Errors as run_groups'.
  void run_rows_sum(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                    int rows, int k, float* out);

  // Layers registered so far: set_layer's highest layer + 1 (a layer below it may be unset).
  int layers() const;
  bool has_layer(int layer) const;
  // Layer `layer`'s weights as registered. InvalidArgument when the layer is unset, tiered (its experts are not in
  // planes: the prompt staging, which copies from them, takes whole layers only) or the pool closed.
  LayerMatrices layer_matrices(int layer) const;
  // Layer `layer`'s forms and sizes: its registered matrices, or for a tiered layer the same matrices without
  // planes (every plane's data null), each plane's nbytes what n_expert experts take of it in canonical form (what
  // read_expert hands out per expert), so that a copy of its experts can be sized and laid out before any is read.
  LayerMatrices layer_forms(int layer) const;

  // Best read bandwidth (bytes/s) of all workers streaming their slice of a `bytes` buffer (huge-page advised,
  // the ISA's widest loads, with and without prefetch), over `reps` passes of each: the host's read ceiling.
  double read_bandwidth(int64_t bytes, int reps);

  // Stops the workers and restores the constructing thread's affinity. Idempotent; the destructor calls it.
  void close() noexcept;

  int threads() const;
  // The threads a job from the calling thread runs on: the workers, and the caller itself where it is pinned
  // apart from them (the constructing thread, with pin_caller), which takes work items instead of waiting.
  int participants() const;
  int max_rows() const;  // the rows run_groups takes per call (PoolOptions::max_rows; 0: none)
  Isa isa() const;
  std::vector<std::vector<int>> worker_cpus() const;
  std::vector<int> caller_cpus() const;
  int parked_workers() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cpu
