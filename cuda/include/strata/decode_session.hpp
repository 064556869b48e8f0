// One sequence decoding on the GPU and the CPU pool: every layer's dense part on the device, the routed
// experts in the VRAM cache on the device and the others answered by the pool through the doorbell, the LM head and the sampler on the device; only the
// token id comes back. Three modes give identical tokens (docs/session.md). Host-only header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/geometry.hpp"
#include "strata/session_layout.hpp"

namespace strata {

class DeviceWeights;
class ExpertCache;
class ExpertStaging;
class PleGather;
namespace cpu {
class ExpertPool;
}

// strata.Mode: how a token's GPU work is launched (token_schedule.hpp).
enum class DecodeMode : int { kUncaptured = 0, kLayerGraphs = 1, kTokenGraph = 2 };

struct DecodeOptions {
  int device = 0;
  int context = 4096;
  KvStorage kv = KvStorage::Int8;
  DecodeMode mode = DecodeMode::kTokenGraph;
  double timeout_seconds = 5.0;  // the GPU's wait for an answer; the host waits 3x this for a ring
  int snapshots = 0;             // slots of recurrent state for snapshot() / restore() (in the arena)
  int prompt_chunk = 0;          // tokens per chunk of feed()'s prompt path; 0: no prompt path
  bool prompt_cpu = true;        // small chunks: the pool computes a share of the experts beside the staging
  bool kv_streaming = false;     // attention KV in page-locked host memory, a VRAM window of it (session.md)
  int defer_experts = 0;         // 0 <= d < n_expert_used: the pool's d lightest routed experts of a layer land
                                 // a layer late (session.md, "Expert deferral"); 0: exact
  int verify_rows = 0;           // 0..kMaxVerifyRows: the most tokens verify() takes (each row's recurrent state
                                 // kept in the arena: docs/speculative.md); 0: no verification steps
};

constexpr int kMaxVerifyRows = 8;  // a pending token and up to 7 drafts
// The most rows a prompt chunk multiplies its dense products with the multi-input GEMVs, as a step of several
// rows does (each launch as many rows as the weight's kernel takes, each reading the weight once: 16 on the tensor
// cores or for a float weight, 8 otherwise); a longer chunk takes the prompt's matmuls. Measured (docs/performance.md, "Prompt
// processing", H100): a prompt of 16 rows 19 ms, of 32 rows 45 ms, where the matmuls took ~1.1 ms a layer for the
// dense products of 32 rows that two 16-row GEMVs take in ~0.26 ms; at 64 rows four GEMVs are still about half.
constexpr int kGemvChunkRows = 64;
// The most rows a step of several rows takes (docs/rows.md): a batched step's sessions, a verification's rows. Each
// row's attention keeps its own split partials.
constexpr int kMaxStepRows = 16;

// The log-probabilities of one position (strata.sampling.log_probabilities): the sampled token's, and the
// n most likely ids with theirs.
struct TokenLogprobs {
  double token = 0.0;
  std::vector<int> ids;
  std::vector<double> values;
};

// One token's sampling, as strata.sampling.SamplingParams defines it (in its order: the bias, the repetition
// penalty, the frequency and presence penalties over the answer, the mask, then the filters and the draw).
struct SamplingValues {
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  float repeat_penalty = 1.0f;
  int top_k = 0;
  double frequency_penalty = 0.0, presence_penalty = 0.0;  // [-2, 2]; over the history from answer_start on
  int answer_start = 0;                                    // where in the history the answer begins
  // The logit bias: n_bias (id, value) pairs, ids in [0, n_vocab), read during the call only. The session keeps the
  // last bias it was given on the device and copies a new one (n_vocab floats) only when it differs.
  const int* bias_ids = nullptr;
  const float* bias_values = nullptr;
  int n_bias = 0;
  // Whether the draw is held to the token mask the caller wrote into the session's token_mask_words() before the
  // call (structured output); a mask that allows no token of the vocabulary is refused (InvalidArgument).
  bool token_mask = false;
  // With token_mask, step()'s draw only (elsewhere InvalidArgument): 0, the words are written before the call;
  // else the draw's ticket: the caller writes the words while the step runs (another thread) and then publishes
  // the ticket (publish_token_mask), which the sampler waits for. A ticket is taken as published once the last
  // one published equals it, so each deferred draw takes one never published before (a count from 1).
  unsigned mask_ticket = 0;
};

// Sums since construction or reset().
struct DecodeStats {
  long tokens = 0;
  double seconds = 0.0;            // wall time of step() calls
  double ring_wait_seconds = 0.0;  // the host spinning for rings (GPU work before each router)
  double pool_seconds = 0.0;       // the pool computing routed experts
  long rings = 0;
  double gpu_pre_seconds = 0.0;    // uncaptured mode only: device time of the layers' pre parts (+ embed)
  double gpu_post_seconds = 0.0;   // uncaptured mode only: device time of the post parts (+ head, sampler)
  std::vector<long> expert_hits, expert_misses;  // per layer: routed experts the VRAM cache held / the pool ran
  std::vector<long> expert_copies;               // per layer: experts the cache's replacement copied in
  long expert_copy_bytes = 0;
  // The prompt path (feed): tokens, chunks and wall time, routed (layer, expert) computations from the staging
  // and from the VRAM cache as the host grouped them (a chunk of at most kGemvChunkRows rows whose experts the cache
  // holds whole runs them on the device, uncounted), and the bytes the staging copied.
  long prompt_tokens = 0, prompt_chunks = 0;
  double prompt_seconds = 0.0;
  long prompt_staged_experts = 0, prompt_cached_experts = 0, prompt_pooled_experts = 0;
  long prompt_staged_bytes = 0;
  long kv_stream_bytes = 0;  // KV streaming: the bytes the windows fetched from the host copy (decode)
  double ple_seconds = 0.0;  // the session's own PLE gather (step and feed): the host hashing and reading rows
  // Steps of several rows (step_batch, verify: docs/rows.md): this session's tokens stepped in them and their wall
  // time, the steps this session led and the graphs it captured for them (a new member set, row count or sampler).
  // A step's routed experts count in the leader's prompt_*_experts.
  long batch_tokens = 0;
  double batch_seconds = 0.0;
  long batch_steps = 0;
  long batch_graphs = 0;
};

// The prompt path's rows rule: a chunk of at least this many routed rows (tokens * n_expert_used) copies whole
// layers ahead, since it touches most of a layer's experts (twice the experts: 1 - e^-2 = 86 % of them for
// uniform routing); a smaller one may give the CPU pool a share, which needs the pool to take this many rows
// (cpu::PoolOptions::max_rows).
inline int prompt_prefetch_rows(const ModelGeometry& g) { return 2 * g.n_expert; }

// Device bytes of a decode session's scratch for `context` tokens of KV (rounded up to whole pages, as the
// session's arena rounds them): its per-token buffers, the RoPE tables and the sampler's `sampler_bytes`
// (sampler_workspace_bytes). The memory plan counts this; the session allocates exactly this.
std::size_t decode_scratch_bytes(const ModelGeometry& geometry, int context, std::size_t sampler_bytes);

// Device bytes of a session's prompt path scratch for chunks of `chunk` tokens and `context` tokens of KV (whole
// pages) in `kv`: the chunk's rows of every layer's buffers and its routed rows, and under KV streaming one
// attention layer's whole KV. The memory plan counts this.
std::size_t prompt_scratch_bytes(const ModelGeometry& geometry, int chunk, int context, KvStorage kv,
                                 bool kv_streaming);

// The GPU sampler's workspace for a vocabulary of `n_vocab`: its sort's size depends on the device's
// architecture, so this needs a CUDA device (CudaError without one).
std::size_t sampler_workspace_bytes(int n_vocab);

class DecodeSession {
 public:
  // Checks every tensor the program reads against the geometry (InvalidArgument naming the tensor), plans
  // and allocates the arena and scratch (OutOfMemory naming the need), builds the RoPE tables. The experts
  // `cache` holds (may be null) run on the GPU, the others on the pool; the prompt path (options.prompt_chunk)
  // computes the experts the cache lacks from `staging` (required then, unless the cache holds every expert).
  // With `ple` (may be null) the session gathers every token's PLE rows itself, on the host loop while the GPU
  // runs the layers below the PLE layer, and resets, snapshots and restores the gather's n-gram state with its
  // own; step() and feed() then take no rows. weights, pool, cache, staging and ple outlive the session.
  DecodeSession(const DeviceWeights& weights, cpu::ExpertPool& pool, const ModelGeometry& geometry,
                const DecodeOptions& options, ExpertCache* cache = nullptr, ExpertStaging* staging = nullptr,
                PleGather* ple = nullptr);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // Appends `token` at the next position and runs every layer and the LM head; with `sample`, returns the
  // sampled next token for the uniform draw u (repetition penalty over every token fed so far), else -1.
  // ple_rows: [ple_n_heads][ple_head_dim] float32 n-gram table rows of this token (required with PLE, unless
  // the session gathers them; null then).
  int step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample);

  // Appends the n tokens at the next positions through the prompt path, in chunks of options.prompt_chunk
  // tokens, each layer once per chunk (docs/prompt.md), then runs the LM head at the last one: the same state
  // as n steps. With `sample`, returns the next token sampled as step() samples it, else -1. ple_rows:
  // [n][ple_n_heads][ple_head_dim] (as step's). With `all_logits` ([n][n_vocab]), every position's logits
  // land there too (scoring: position i's are those step() would leave after token i).
  int feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u, bool sample,
           float* all_logits = nullptr);

  // A verification step (docs/speculative.md): the n (1..min(verify_rows, prompt_chunk)) tokens appended as one
  // prompt chunk, every position's logits into all_logits ([n][n_vocab]), nothing sampled, and each row's
  // recurrent state kept. Until the next step, feed, verify, snapshot, restore or reset, truncate(position) then
  // brings the sequence back to exactly what stepping its first position - start tokens would leave (start: the
  // position before the verify; position in start + 1 .. start + n). logits() and logprobs() after a truncate
  // that cut tokens are not defined: the rows' logits are the caller's.
  void verify(const int* tokens, int n, const float* ple_rows, float* all_logits);
  void truncate(int position);
  int verify_rows() const noexcept;

  // A batched decode step (docs/batch.md): sessions[i] appends tokens[i] at its next position, all n of them
  // through every layer and the LM head at once on the leader's prompt path (the dense products over the n rows,
  // each routed expert once for the rows that chose it, the mixers over each session's own state); each session
  // then samples its row into out[i] with `sample`, as step() samples (else -1), and its logits() and logprobs()
  // read that row. A row is what the same session stepped in a batch of one gives, bit for bit, and its logits
  // those of the prompt path's row for its token (feed's all_logits). Where the expert cache holds every expert,
  // the rows' routing stays on the device and, in a graph mode, the step is a captured graph per member set. The
  // leader is the session whose runner was made first, and the rows go in the order the runners were made, so the
  // same members in any order are one step and replay one graph.
  // ple_rows[i]: as step's for session i. The sessions share the weights, pool, expert cache, staging, device,
  // context and KV format, none streams its KV, n <= the leader's prompt chunk and kMaxStepRows (InvalidArgument
  // otherwise, before any state changes). step_rows with a one-token part per session.
  static void step_batch(DecodeSession* const* sessions, int n, const int* tokens, const float* const* ple_rows,
                         const SamplingValues* sampling, const double* u, bool sample, int* out);

  // One session's part of a step of several sessions' rows (step_rows). A plain part is one token, sampled into
  // `sampled` with `sample` as step() samples (else -1). A verification (`verify`) is 1..verify_rows() tokens,
  // every row's logits into `logits` ([count][n_vocab] host floats), nothing sampled and each row's state kept,
  // as verify() leaves the session (truncate() then cuts it back).
  struct StepPart {
    const int* tokens = nullptr;
    int count = 1;
    const float* ple_rows = nullptr;  // [count] as step's and verify's
    bool verify = false;
    float* logits = nullptr;
    bool sample = false;
    SamplingValues sampling;
    double u = 0.0;
    int sampled = -1;  // out
  };

  // The parts of n sessions as one step of their rows laid end to end (docs/rows.md): verifications of several
  // sessions, and plain steps beside them, on the leader's prompt path (step_batch's), each row what its session
  // gives in a step of its part alone, bit for bit. The sessions as step_batch's, their rows in all at most the leader's
  // prompt chunk and kMaxStepRows (InvalidArgument otherwise, before any state changes).
  static void step_rows(DecodeSession* const* sessions, StepPart* parts, int n);

  // Control vectors (docs/control_vectors.md): from the next step on, every path (step, feed, verify, step_batch, in
  // every mode; step_rows too) adds row l of `table` ([n_layer][n_embd] host floats) to every residual stream after layer l's last
  // write, on the layers l where layers[l] ([n_layer]) is nonzero; the other rows are not read. All zero: none (the
  // default), which runs exactly as a session without them. The state already fed keeps what its vectors gave. New
  // values on the same layers are a copy into the session's table, which its captured graphs read; a layer that
  // gains or loses a vector makes the session capture its decode graphs again, once. InvalidArgument, before
  // anything changes, for a value that is not finite; the table (4 * n_layer * n_embd bytes of VRAM) is allocated
  // the first time a layer has one (OutOfMemory).
  void set_control_vectors(const float* table, const std::uint8_t* layers);
  std::vector<int> control_vector_layers() const;  // the layers with a vector now

  // feed() of the n tokens (nothing sampled), recording on the way each layer's output at the last of them, the mean
  // of its residual streams (the streams after the layer's last write, its control vector included), into out
  // [n_layer][n_embd]: what `strata cvector` measures (docs/control_vectors.md). Needs the prompt path.
  void layer_states(const int* tokens, int n, const float* ple_rows, float* out);

  void logits(float* out) const;  // [n_vocab] of the last step or feed
  void reset();                   // an empty sequence; stats start over

  // Log-probabilities at the last step's position for `token` and the n (<= 20) most likely ids, computed on
  // the device from its logits; with `token_mask`, over the tokens token_mask_words() allow (the caller keeps
  // `token` one of them and n within their count).
  TokenLogprobs logprobs(int token, int n, bool token_mask = false) const;

  // The token mask of the next draw that sets SamplingValues::token_mask: token_mask_size() int32 words, bit t % 32
  // of word t / 32 set where token t may be drawn (strata.sampling.TokenMask's layout), in page-locked memory the
  // sampler reads where it stands, so the host writes it in place (no copy) before the call. Lives as the session.
  std::int32_t* token_mask_words() const noexcept;
  int token_mask_size() const noexcept;

  // A step() whose draw takes a mask_ticket runs its layers without the mask; its sampler waits for the caller, on
  // any thread, to write token_mask_words() and call publish_token_mask(ticket) (a release: the words' writes come
  // first). Where that takes longer than options.timeout_seconds the sampler gives up, and the step, once the
  // token is fed (its position counted, its state written), throws Error "the token mask of draw <ticket> was not
  // published within <timeout> s". The caller checks the words first (check_token_mask): a mask that allows no
  // token is refused before the step for a mask written before it, and by the writer for one written after.
  void publish_token_mask(unsigned ticket) const noexcept;
  void check_token_mask() const;  // InvalidArgument unless token_mask_words() allow some token of the vocabulary

  // The sequence so far kept in snapshot slot `slot` (options.snapshots of them), and brought back: restore
  // returns to that position; what was fed after it is forgotten.
  void snapshot(int slot);
  void restore(int slot);

  // Which sessions may step together (step_batch, docs/rows.md): those whose keys are equal and not empty. The
  // one definition of it: the weights, pool, expert cache, staging, device, context and KV format a step's rows
  // share. Empty where this session steps with none: it has no prompt path, or its KV streams.
  std::string batch_key() const;

  int position() const noexcept;
  int context() const noexcept;
  int prompt_chunk() const noexcept;  // 0: no prompt path
  DecodeMode mode() const noexcept;
  bool captured() const noexcept;  // graph modes: the graphs exist (captured on the first step)
  const DecodeStats& stats() const;  // reads the streaming windows' byte counter from the device

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
