// The CPU expert pool: pinned workers that compute the routed experts of one MoE layer, streaming the
// expert weights (canonical forms, docs/forms.md: float or quantized, any mix within a layer) at the machine's
// memory bandwidth. Host-only, no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

  // out[j][:] = weights[j] * down(silu(gate x) * up x) for expert ids[j], j < k, except where skip[j] != 0
  // (those rows of out are not written). x: n_embd floats; out: k * n_embd floats. Blocking; allocates
  // nothing. skip may be null.
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
  // begin[groups] <= PoolOptions::max_rows; a group may be empty. Blocking; allocates nothing.
  void run_groups(int layer, const float* x, const int32_t* experts, const int* begin, int groups, float* out);

  // Layers registered so far: set_layer's highest layer + 1 (a layer below it may be unset).
  int layers() const;
  bool has_layer(int layer) const;
  // Layer `layer`'s weights as registered. InvalidArgument when the layer is unset or the pool closed.
  LayerMatrices layer_matrices(int layer) const;

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
