// What steps a sequence (docs/architecture.md, "Sequences and the runner"): the decode program and the prompt
// program over the sequence's inputs, the token schedule of the session's mode, the doorbell and its ring
// answerer, the pinned stage the host writes before a launch, the stream, and the execution counters. The state
// it steps is the Sequence's (state/sequence.hpp), passed to every call.
//
// Today a runner's programs (and the graphs captured from them) are built over one sequence's device views, so
// it steps that sequence alone and refuses another (InvalidArgument). That is the seam for more than one: programs
// that read each row's views from device memory let one runner step R rows per layer, one token each of B
// sequences or k + 1 tokens of one (docs/architecture.md), without a sequence holding anything of the runner.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "../runtime/pinned_memory.hpp"
#include "../runtime/stream.hpp"
#include "exchange/doorbell_host.hpp"
#include "exchange/ring_answerer.hpp"
#include "programs/decode_program.hpp"
#include "programs/graph.hpp"
#include "programs/program_inputs.hpp"
#include "programs/prompt_program.hpp"
#include "programs/token_schedule.hpp"
#include "sampler_inputs.hpp"
#include "state/sequence.hpp"
#include "strata/decode_session.hpp"
#include "strata/expert_cache.hpp"
#include "strata/expert_pool.hpp"
#include "strata/expert_staging.hpp"

namespace strata {

class Runner;

// One span of a step of several rows (docs/rows.md; docs/architecture.md, "Sequences, row batches and the runner"):
// `count` tokens of a sequence at its next positions, whether each row's state is kept (a verification, which
// truncate() may then cut back to any row), whether every row's logits come back, and the last row's sampling.
struct RowBatchSpan {
  Runner* runner = nullptr;      // the sequence's own: its sampler draws from the span's last row, whose logits
                                 // its logits() and logprobs() read after
  Sequence* sequence = nullptr;
  const int* tokens = nullptr;
  int count = 0;
  const float* ple_rows = nullptr;  // [count] PLE rows (null: none, or the sequence gathers them)
  bool keep_rows = false;
  float* logits = nullptr;          // host [count][n_vocab]: every row's logits (null: none come back)
  bool sample = false;
  SamplingValues sampling;
  double u = 0.0;
  int sampled = -1;                 // set by the step where `sample`
};

// A step as one value: its spans, rows one after another. DecodeSession::step_batch and verify build one.
using RowBatch = std::vector<RowBatchSpan>;

class Runner {
 public:
  // Programs over `tables` and `sequence` (both outlive the runner) in `options`' mode, device and prompt chunk;
  // `cache` (may be null) and `staging` as DecodeSession takes them.
  Runner(cpu::ExpertPool& pool, const ModelGeometry& geometry, const DecodeOptions& options,
         const ProgramTables& tables, const Sequence& sequence, ExpertCache* cache, ExpertStaging* staging);

  // DecodeSession::step and feed on `sequence`: its next position(s) through every layer and the LM head.
  int step(Sequence& sequence, int token, const float* ple_rows, const SamplingValues& sampling, double u,
           bool sample);
  int feed(Sequence& sequence, const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling,
           double u, bool sample, float* all_logits);
  // A step of several rows through this runner's prompt program (docs/rows.md): every span's rows at once, each
  // span over its own sequence. The spans' sequences share this runner's model, context and KV format; none
  // streams its KV (InvalidArgument otherwise, and for anything step() or verify() refuses, before any state
  // changes).
  void run(RowBatch& batch);

  // DecodeSession::set_control_vectors and layer_states on `sequence`: its vectors from now on (where a layer gains
  // or loses one, the decode program's graphs are dropped, captured again on the next token); feed()'s prompt path
  // recording each layer's output at the last token into out [n_layer][n_embd].
  void set_control_vectors(Sequence& sequence, const float* table, const std::uint8_t* layers);
  void layer_states(Sequence& sequence, const int* tokens, int n, const float* ple_rows, float* out);

  // DecodeSession::verify and truncate on `sequence`.
  void verify(Sequence& sequence, const int* tokens, int n, const float* ple_rows, float* all_logits);
  void truncate(Sequence& sequence, int position);
  TokenLogprobs logprobs(const Sequence& sequence, int token, int n, bool token_mask);
  const SamplerInputs& sampler_inputs() const noexcept { return sampler_inputs_; }
  void logits(float* out) const;  // the last step's or feed's

  // `sequence` emptied (after the stream drains) and the counters started over.
  void reset(Sequence& sequence);
  void snapshot(Sequence& sequence, int slot);
  void restore(Sequence& sequence, int slot);

  int prompt_chunk() const noexcept { return prompt_ ? prompt_->chunk() : 0; }
  long serial() const noexcept { return serial_; }  // never reused: what a captured step's key names a member by
  bool captured() const noexcept { return schedule_.captured(); }
  // The counters, with `sequence`'s streaming windows' fetched bytes read from the device.
  const DecodeStats& stats(const Sequence& sequence);

 private:
  void check_bound(const Sequence& sequence) const;
  // `layer_states` (device-visible [n_layer][n_embd], or null): where the last chunk records each layer's output.
  int run_prompt(Sequence& sequence, const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling,
                 double u, bool sample, float* all_logits, bool row_states, float* layer_states = nullptr);
  void check_batch(const RowBatch& batch) const;
  // The PLE rows of `n` tokens of `sequence`: where it gathers them itself, into `out` from row `first` on (grown
  // to hold them), else `given`.
  const float* gathered_ple(Sequence& sequence, const int* tokens, int n, const float* given, std::vector<float>& out,
                            int first = 0);
  // Launches a step of several rows enqueued by `enqueue`: its graph (captured on first use, by `key`) where the
  // mode captures and the step waits for nothing on the host (its experts all on the device, or exchanged through
  // rows_bell_), else enqueued as it is.
  void launch_step(const std::vector<long>& key, const std::function<void(cudaStream_t)>& enqueue);
  RowsExchange rows_exchange(cpu::ExpertPool& pool);
  // A step that exchanges: each MoE layer's ring answered for its `rows` rows, in layer order (run() checks the
  // answers once the stream has drained).
  void answer_step(int rows, int ring_base);
  void note_exchange();
  void check_feed(const Sequence& sequence, const int* tokens, int n, const float* ple_rows, double u) const;
  ProgramIo program_io() const;
  ExpertDeferral deferral() const { return {options_.defer_experts, g_.n_layer}; }
  double cpu_share(cpu::ExpertPool& pool, const ExpertStaging* staging) const;
  void refresh_cache();
  void run_token(Sampler sampler, int ring_base, PleGather* late_ple, int late_token);
  void gather_ple(PleGather& ple, int token, float* out);
  Sampler sampler_for(bool sample) const;
  // The stage's values of the draw after `token` at position `at` (with `sample`: `sampling`'s, checked already by
  // sampler_inputs_.check; a new bias copied on `stream`, the one the draw runs on).
  void stage_sampling(const SamplingValues& sampling, double u, int token, int at, bool sample, cudaStream_t stream);

  // The most captured steps a runner keeps (shapes, member sets and samplers); a new one then replaces the one
  // launched longest ago (a server's member sets come and go; dropping them all would capture the live ones again).
  static constexpr std::size_t kMaxStepGraphs = 64;
  struct StepGraph {
    CapturedGraph graph;
    long last_launch = 0;  // step_launches_ when last launched
  };

  long serial_;
  ModelGeometry g_;
  ExpertCache* cache_;
  DecodeOptions options_;
  const Sequence* bound_;  // the sequence the programs read
  std::vector<int> host_cpus_;
  DoorbellHost bell_;
  RingAnswerer answerer_;
  PinnedMapped stage_, sampled_;
  SamplerInputs sampler_inputs_;  // before program_, which reads its mask's address
  DecodeProgram program_;
  TokenSchedule schedule_;
  std::chrono::nanoseconds ring_timeout_;
  // A step of several rows' doorbell and its answerer (the prompt path's, where the pool's grouped calls hold a
  // step's routed rows): the routed experts the cache lacks, one ring a MoE layer for all the rows.
  std::unique_ptr<DoorbellHost> rows_bell_;
  std::unique_ptr<RingAnswerer> rows_answerer_;
  long steps_run_ = 0;  // steps of several rows rung through rows_bell_: their ring bases
  std::unique_ptr<PromptProgram> prompt_;  // options.prompt_chunk > 0
  Stream stream_;  // after every buffer: destroyed (and drained) before any of them is freed
  long tokens_run_ = 0;
  DecodeStats stats_;
  ExchangeStats exchange_;
  std::vector<float> feed_rows_;  // feed(), verify() and step_batch(): the rows' PLE rows
  std::unique_ptr<PinnedMapped> layer_states_;  // layer_states(): [n_layer][n_embd], made on its first call
  std::map<std::vector<long>, StepGraph> step_graphs_;  // the steps of several rows this runner led
  long step_launches_ = 0;
};

}  // namespace strata
