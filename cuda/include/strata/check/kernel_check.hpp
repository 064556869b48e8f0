// Host round trips of single kernels, so Python tests can check each one against the numpy reference.
// Each call copies its inputs to the device, poisons the output (NaN bytes) inside guard bands, runs the
// kernel, verifies that the guard bands are untouched, and copies the output back. Not for the token path:
// these allocate and synchronise.
#pragma once

#include <cstdint>
#include <string>

#include "strata/check/q8_host.hpp"
#include "strata/forms.hpp"

namespace strata::kernel_check {

// y = rms_norm(x) * w over `rows` rows of `cols` floats, computed on `device`; with y_q8 (one row of
// rows * cols) also the q8_32 form the kernel writes beside y.
void rms_norm(int device, const float* x, const float* w, float* y, int rows, int cols, float eps,
              const Q8Host& y_q8 = {});

// Grouped RMSNorm: each row of groups * cols floats normalised per slice of `cols`, scaled by w [groups * cols].
void rms_norm_grouped(int device, const float* x, const float* w, float* y, int rows, int groups, int cols,
                      float eps);

// Gated RMSNorm per head (x, z, y [heads][head_dim], w [head_dim]); gate "sigmoid" or "silu"; with y_q8 (one row
// of heads * head_dim) also the q8_32 form the kernel writes beside y.
void rms_norm_gated(int device, const float* x, const float* z, const float* w, float* y, int heads, int head_dim,
                    float eps, const std::string& gate, const Q8Host& y_q8 = {});

// L2 norm per head: y = x / sqrt(sum x^2 + eps) over each row of head_dim.
void l2_norm(int device, const float* x, float* y, int heads, int head_dim, float eps);

// NEOX RoPE of x [tokens][heads][head_dim] (in: x, out: y) on the first rope_dim dims, at positions [tokens],
// from tables the host builds in float64 for theta (max position + 1 rows).
void rope_neox(int device, const float* x, const std::int32_t* positions, float* y, int tokens, int heads,
               int head_dim, int rope_dim, double theta);

// q8_32 of x [n] (n a multiple of 32): xq [n], dx [n / 32], sums [n / 32].
void quantize_q8_32(int device, const float* x, long n, std::int8_t* xq, float* dx, std::int32_t* sums);

// y [rows] = W x for a quantized W given by host planes (docs/forms.md): x is quantized to q8_32 on the
// device first, then the GEMV runs.
void gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                const float* x, float* y);

// y [rows] = W x for a float W [rows][cols] of `kind` (host bytes) and float32 x.
void gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, const float* x, float* y);

// The batched GEMV (kernels/gemv.cuh) over a host stack of n_matrix matrices of rows x cols, matrix-major in
// every plane (host_stack holds n_matrix * rows rows; w_stack [n_matrix * rows][cols]): y [count][rows] with
// y_j = M[slots[j]] x_j. x holds cols floats when x_stride is 0 (every product reads it), else count rows of
// x_stride >= cols floats (product j reads row j; a multiple of 32 for the quantized forms, whose x is
// quantized on the device in one q8_32 call). The rows of a skipped product (slots[j] < 0) come back as the
// poison, NaN. Arguments are checked before any device work: count, x_stride, and every slot against the stack.
// `split` (quantized stacks): warps per weight row, 0 the kernels' rule, else 1, 2 or 4 (what a benchmark forces).
void gemv_quant_batch(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                      int cols, const std::int32_t* slots, int count, int x_stride, const float* x, float* y,
                      int split = 0);
void gemv_float_batch(int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
                      const std::int32_t* slots, int count, int x_stride, const float* x, float* y);

// The multi-input GEMV (kernels/gemv.cuh, gemv_quant_inputs): y [inputs][rows], y_i = W x_i, x [inputs][x_stride]
// (x_stride >= cols, a multiple of 32; each row's first cols are the activation), quantized to q8_32 on the device
// in one call. `kernel`: 0 the launcher's choice, 1 the integer walk, 2 the tensor cores (refused for a form or
// width they do not take). Arguments are checked before any device work.
void gemv_quant_inputs(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                       int inputs, int x_stride, const float* x, float* y, int kernel = 0);
// Its float form (gemv_float_inputs): W [rows][cols] of `kind`, x [inputs][x_stride] (x_stride >= cols), y
// [inputs][rows]. Arguments are checked before any device work.
void gemv_float_inputs(int device, FloatKind kind, const void* w, int rows, int cols, int inputs, int x_stride,
                       const float* x, float* y);

// Median time in seconds of one GEMV launch (CUDA events), with L2 cold: launches cycle through enough
// device copies of the weight to overflow the L2 cache. Inputs as gemv_quant / gemv_float.
double time_gemv_quant(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                       int reps);
double time_gemv_float(int device, FloatKind kind, const void* w, int rows, int cols, int reps);
// The same for 1..max_inputs activations of one matrix (one upload of its copies): batch_seconds[i - 1] of a
// batch of i products of the matrix (gemv_quant_batch, each product decoding it again), inputs_seconds[i - 1] of
// one multi-input GEMV (gemv_quant_inputs, its kernel chosen as gemv_quant_inputs' `kernel` above).
void time_gemv_quant_inputs(int device, const QuantForm& form, const QuantPlanes& host_planes, int rows, int cols,
                            int max_inputs, int reps, double* batch_seconds, double* inputs_seconds, int kernel = 0);
// The same for a float W: a batch of i products of it (gemv_float_batch) against gemv_float_inputs.
void time_gemv_float_inputs(int device, FloatKind kind, const void* w, int rows, int cols, int max_inputs, int reps,
                            double* batch_seconds, double* inputs_seconds);

// Median seconds of one batch of `count` products over a host stack of n_matrix quantized matrices (product j of
// matrix j % n_matrix, each its own x), with the L2 cold, each weight row read by `split` warps (0: the kernels'
// rule; 1, 2 or 4): the routed experts' GEMVs (a decode token's 10, a step's rows times 10).
double time_gemv_quant_batch(int device, const QuantForm& form, const QuantPlanes& host_stack, int n_matrix, int rows,
                             int cols, int count, int split, int reps);

// Throws the error kind named by `kind` ("invalid_argument", "out_of_memory", "format", "cuda", "error"),
// so tests can prove that each arrives in Python as the right exception.
void raise_error(const std::string& kind);

// MoE router (kernels/router.cuh) over logits [tokens][n_expert]: ids [tokens][k] in descending probability
// (exact ties to the lower index), weights [tokens][k] renormalised to sum 1.
void moe_route(int device, const float* logits, int tokens, int n_expert, int k, std::int32_t* ids,
               float* weights);

// The shared expert's gates gate [rows] = sigmoid(w . x[r]) for w [n] and x [rows][n].
void shared_expert_gate(int device, const float* w, const float* x, int rows, int n, float* gate);

// h = silu(g) * u over n floats; with h_q8 (one row of n) also the q8_32 form the kernel writes beside h.
void swiglu(int device, const float* g, const float* u, float* h, int n, const Q8Host& h_q8 = {});

// out [rows][n] = routed + gate[r] * shared, row by row (routed, shared [rows][n]; the gates [rows] travel
// through device memory, as on the token path).
void moe_combine(int device, const float* routed, const float* shared, const float* gate, float* out, int rows,
                 int n);

// out [tokens][n] = (accumulate ? out : 0) + for each token t the sum over j with slots[t][j] >= 0 of
// weights[t][j] * rows[t*k + j][:] (rows [tokens*k][n], slots and weights [tokens][k]): with accumulate, out is
// uploaded and added to; without, the device's out starts as the poison, NaN, so a result that read it shows.
void moe_cached_sum(int device, const float* rows, const std::int32_t* slots, const float* weights, int tokens,
                    int k, int n, bool accumulate, float* out);

// out [tokens][n] = for each token t the sum over j with row_of[t][j] >= 0 of weights[t][j] * rows[row_of[t][j]]
// (rows [n_rows][n], row_of and weights [tokens][k]); every row_of is checked to be < n_rows before any device
// work.
void moe_weighted_rows(int device, const float* rows, int n_rows, const std::int32_t* row_of, const float* weights,
                       int tokens, int k, int n, float* out);

// dst [m][n] = src[index[i]] (src [src_rows][n]); every index is checked to be a row of src before any device work.
void gather_rows(int device, const float* src, int src_rows, const std::int32_t* index, int m, int n, float* dst);

// slots[i] = slot_of[ids[i]] (slot_of [n_expert], -1 where not held); every id is checked to be an expert first.
void cache_slots(int device, const std::int32_t* slot_of, int n_expert, const std::int32_t* ids, int count,
                 std::int32_t* slots);

}  // namespace strata::kernel_check

namespace strata {
struct HostTensor;  // strata/device_weights.hpp: one weight in its canonical form, host planes
}  // namespace strata

namespace strata::kernel_check {

// Host destinations of route_publish's results, each [replays] of what is named.
struct RoutePublishOutputs {
  float* logits = nullptr;         // [n_expert] the router GEMV's output, as the CTAs handed it to the last one
  std::int32_t* ids = nullptr;     // [k]
  float* weights = nullptr;        // [k]
  std::int32_t* slots = nullptr;   // [k] slot_of[ids]; poison (-1) without slot_of
  float* bell_x = nullptr;         // [n] the doorbell as the host read it after the replay; poisoned before it
  std::int32_t* bell_ids = nullptr;  // [k]
  float* bell_weights = nullptr;   // [k]
  std::int32_t* seq = nullptr;     // [1] the ring number the host saw
  std::uint32_t* ticket = nullptr;  // one word (not per replay): the CTAs' ticket after the last replay
};

// The decode step's fused router (kernels/router_publish.cuh) through the decode step's own calls
// (quantize_for, then route_and_publish: q8_32 of x first for a quantized router): router [n_expert][n] (float or
// quantized) on x [replays][n], top k, slots from slot_of [n_expert] (may be null) and, with `ring`, the publish
// into a doorbell in mapped host memory. Captured once into a CUDA graph and replayed once per row of x, every
// output and the doorbell poisoned (0xFF bytes) before each replay; replay r rings ring_base + r + 1.
void route_publish(int device, const HostTensor& router, const float* x, int replays, int k,
                   const std::int32_t* slot_of, bool ring, int ring_base, const RoutePublishOutputs& out);

// Host destinations of hc_read's and hc_read_fused's results (each writes the ones it names).
struct HcReadOutputs {
  float* normed = nullptr;  // hc_read: [streams * n] the grouped-normalised streams Hn
  float* rms = nullptr;     // hc_read_fused: [streams] each stream's inverse RMS (Hn_k = h_k rms_k norm_k)
  float* low = nullptr;     // [rank] silu(W_down Hn / streams)
  float* x = nullptr;       // [n] the block input
  float* inj = nullptr;     // [streams] 2 sigmoid(W_inj Hn / streams); untouched without an inject weight
  Q8Host x_q8;              // hc_read_fused, where given: x's q8_32 form [n] as hc_read_up_mix wrote it beside x
};

// The whole hyper-connection read (docs/models/qwen4exp.md §3(a)) of h [streams][n] chained on the device as the
// decode step's fallback and the prompt path run it: grouped RMSNorm by norm [streams * n] -> q8_32 -> down GEMV
// -> silu(/streams) -> q8_32 -> up GEMV -> sigmoid-gated mean over the streams; with `inject`, inject GEMV ->
// 2 sigmoid(/streams). down [rank][streams * n], up [streams * n][rank], inject [streams][streams * n] (may be
// null: the final mixer); float forms take the float32 activation instead of q8_32.
void hc_read(int device, const float* h, const float* norm, int streams, int n, float eps, const HostTensor& down,
             const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out);

// The same read fused as the decode step runs it (kernels/hc_read.cuh): hc_read_down, then hc_read_up_mix (with
// x's q8_32 form where out.x_q8 asks for it). InvalidArgument where hc_read_fusable refuses the shape or the
// weights' forms (the decode program chains the eight kernels there).
void hc_read_fused(int device, const float* h, const float* norm, int streams, int n, float eps,
                   const HostTensor& down, const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out);

// hc_mix alone: x [rows][n] = the sigmoid-gated mean over the streams of up and normed [rows][streams][n].
void hc_mix(int device, const float* up, const float* normed, float* x, int rows, int streams, int n);

// The write-back: h_out [rows][streams][n] = h + inj[r * inj_stride + k] * y[r] for every row r and stream k
// (y [rows][n]; inj holds (rows - 1) * inj_stride + streams floats: [streams] for stride 0, [rows][streams]
// for stride streams).
void hc_write(int device, const float* h, const float* inj, int inj_stride, const float* y, float* h_out, int rows,
              int streams, int n);

// hc_write with an addend (kernels::StreamAddend, a layer's control vectors): without `per_row`, vectors [n] added to
// every row; with it, vectors [rows][n], each row's own through a table of pointers in device memory (null for a
// row whose row_has[r] is 0), each pointing `n` floats before its vector, as a sequence's table holds a layer's.
void hc_write_steered(int device, const float* h, const float* inj, int inj_stride, const float* y,
                      const float* vectors, const std::uint8_t* row_has, bool per_row, float* h_out, int rows,
                      int streams, int n);

// The mean of one row's streams h [streams][n] into out [n] (kernels::hc_stream_mean: `strata cvector`'s state).
void hc_stream_mean(int device, const float* h, float* out, int streams, int n);

// The SamplingParams fields sample_tokens takes beside the filters': the logit bias (dense [vocab], 0 where a
// token has none; null: none), the frequency and presence penalties over seen[answer_start:], and the token mask
// ([(vocab + 31) / 32] words, strata.sampling.TokenMask's layout; null: none).
struct SampleExtras {
  const float* bias = nullptr;
  double frequency_penalty = 0.0, presence_penalty = 0.0;
  int answer_start = 0;
  const std::int32_t* mask = nullptr;
};

// The token strata.sampling.sample picks, for each uniform draw u in draws [n_draws], into tokens [n_draws]:
// logits [vocab], the seen ids [n_seen] for the penalties, and the SamplingParams fields. Arguments
// are checked as the reference checks them (before any device work); the per-token values travel in device
// memory as on the token path (the mask in mapped page-locked memory, as a session's), and with `graph` one
// captured CUDA graph is replayed for every draw. With `argmax_path` the launch is sample_argmax's (no sort),
// which the values must allow (kernels::picks_argmax). The answer's counts buffer is checked to be all zero
// again after the draws (the sampler's invariant).
void sample_tokens(int device, const float* logits, int vocab, const std::int32_t* seen, int n_seen,
                   double temperature, int top_k, double top_p, double min_p, double repeat_penalty,
                   const SampleExtras& extras, const double* draws, int n_draws, bool graph, bool argmax_path,
                   std::int32_t* tokens);

}  // namespace strata::kernel_check
