#include "runner.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "../kernels/sample.cuh"
#include "strata/cpu_topology.hpp"
#include "strata/error.hpp"
#include "strata/ple_gather.hpp"

namespace strata {
namespace {

// The host loop's core: the first physical core, which the pool leaves free of workers (expert_pool.hpp).
// Empty on a one-core machine, where the loop shares the only core.
std::vector<int> host_loop_cpus() {
  const std::vector<cpu::PhysicalCore> cores = cpu::physical_cores();
  return cores.size() >= 2 ? cores.front().cpus : std::vector<int>{};
}

// Pins the calling thread to the host loop's core for one step (its ring spins must not share a core with
// a pool worker) and puts its affinity back afterwards, so the caller's thread is only borrowed.
class HostLoopPin {
 public:
  explicit HostLoopPin(const std::vector<int>& cpus) {
    if (!cpus.empty()) cpu::pin_current_thread(cpus);
  }
  HostLoopPin(const HostLoopPin&) = delete;
  HostLoopPin& operator=(const HostLoopPin&) = delete;
  ~HostLoopPin() { saved_.restore(); }

 private:
  cpu::SavedAffinity saved_;  // constructed before the pin: the caller's own affinity
};

// A runner's serial: what a captured batch's key names each member by (an address may be reused, a serial not).
long next_serial() {
  static std::atomic<long> serial{0};
  return ++serial;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Runner::Runner(cpu::ExpertPool& pool, const ModelGeometry& geometry, const DecodeOptions& options,
               const ProgramTables& tables, const Sequence& sequence, ExpertCache* cache, ExpertStaging* staging)
    : serial_(next_serial()),
      g_(geometry),
      cache_(cache),
      options_(options),
      bound_(&sequence),
      host_cpus_(host_loop_cpus()),
      bell_(g_.n_embd, g_.n_expert_used),
      answerer_(pool, bell_, cache, deferral()),
      stage_(DecodeProgram::stage_bytes(g_)),
      sampled_(sizeof(int)),
      sampler_inputs_(geometry.n_vocab, options.timeout_seconds),
      program_(g_, tables.inputs(sequence), options.device, program_io(), cache),
      schedule_(program_, options.mode),
      ring_timeout_(host_ring_timeout(options.timeout_seconds)) {
  if (options.prompt_chunk > 0) {
    prompt_ = std::make_unique<PromptProgram>(g_, tables.inputs(sequence), options.device, options.prompt_chunk,
                                              staging, cache, &pool, cpu_share(pool, staging), rows_exchange(pool));
  }
}

// The doorbell of a step of several rows, where the pool's grouped calls hold the most routed rows a step has
// (kMaxStepRows x k); none otherwise (such steps group their experts on the host, as a prompt chunk does).
RowsExchange Runner::rows_exchange(cpu::ExpertPool& pool) {
  const int rows = std::min(options_.prompt_chunk, kMaxStepRows);
  if (pool.max_rows() < rows * g_.n_expert_used) return {};
  rows_bell_ = std::make_unique<DoorbellHost>(g_.n_embd, g_.n_expert_used, 0, rows);
  rows_answerer_ = std::make_unique<RingAnswerer>(pool, *rows_bell_, cache_);
  RowsExchange exchange;
  exchange.bell = rows_bell_->device_view();
  exchange.ring_base = rows_bell_->ring_base_device();
  exchange.status = rows_bell_->status_device();
  exchange.timeout_ns = device_answer_timeout_ns(options_.timeout_seconds);
  return exchange;
}

// The exchange's counters into the stats: the decode tokens' rings and a step's alike.
void Runner::note_exchange() {
  stats_.ring_wait_seconds = exchange_.ring_wait_seconds;
  stats_.pool_seconds = exchange_.pool_seconds;
  stats_.rings = exchange_.rings;
  stats_.expert_hits = exchange_.hits;
  stats_.expert_misses = exchange_.misses;
}

void Runner::answer_step(int rows, int ring_base) {
  const HostLoopPin pin(host_cpus_);  // its ring spins must not share a core with a pool worker
  for (int layer = 0; layer < g_.n_layer; ++layer) {
    if (prompt_->rings(layer)) {
      rows_answerer_->answer_rows(layer, kernels::ring_at(ring_base, layer + 1), rows, ring_timeout_, exchange_);
    }
  }
}

ProgramIo Runner::program_io() const {
  ProgramIo io;
  io.host_stage = stage_.host<void>();
  io.bell = bell_.device_view();
  io.ring_base = bell_.ring_base_device();
  io.wait_status = bell_.status_device();
  io.answer_timeout_ns = device_answer_timeout_ns(options_.timeout_seconds);
  io.sampled = sampled_.device<int>();
  io.token_mask = sampler_inputs_.mask_device();
  io.mask_published = sampler_inputs_.publication();
  io.deferral = deferral();
  return io;
}

void Runner::check_bound(const Sequence& sequence) const {
  STRATA_EXPECTS(&sequence == bound_, InvalidArgument,
                 "this runner's programs and graphs read the sequence they were built over; it steps no other");
}

// The share of a small chunk's staged bytes the pool takes so that both finish together: its host read rate
// against the staging's PCIe rate, both measured (0: no CPU share, or a pool without the rows for it).
double Runner::cpu_share(cpu::ExpertPool& pool, const ExpertStaging* staging) const {
  if (!options_.prompt_cpu || !staging || staging->copy_rate() <= 0.0 ||
      pool.max_rows() < prompt_prefetch_rows(g_)) {
    return 0.0;
  }
  const double host = pool.read_bandwidth(std::int64_t{1} << 28, 2);
  return host / (host + staging->copy_rate());
}

// The cache's replacement between tokens: its map changes here only, ahead of the token on this stream.
void Runner::refresh_cache() {
  if (!cache_) return;
  for (const ExpertMove& move : cache_->between_tokens(stream_.get())) {
    if (static_cast<int>(stats_.expert_copies.size()) <= move.layer) stats_.expert_copies.resize(g_.n_layer, 0);
    ++stats_.expert_copies[move.layer];
    stats_.expert_copy_bytes += static_cast<long>(cache_->expert_bytes(move.layer));
  }
}

// `late_ple`: the gather of `late_token`'s PLE rows, after the launch and before any ring is answered (null:
// none); the GPU copies them up at the PLE layer, behind its wait for a ring below it.
void Runner::run_token(Sampler sampler, int ring_base, PleGather* late_ple, int late_token) {
  schedule_.run(sampler, stream_.get(), [this, ring_base, late_ple, late_token](int layer) {
    if (layer == 0 && late_ple) gather_ple(*late_ple, late_token, stage_.host<float>(kStagePleOffset));
    answerer_.answer(layer, kernels::ring_at(ring_base, layer + 1), ring_timeout_, exchange_);
  });
  bell_.check_answers(ring_base, options_.timeout_seconds);
  const StageSeconds stages = schedule_.stage_seconds();
  stats_.gpu_pre_seconds += stages.pre;
  stats_.gpu_post_seconds += stages.post;
}

// The session's own gather of `token`'s PLE rows into `out`, timed.
void Runner::gather_ple(PleGather& ple, int token, float* out) {
  const auto start = std::chrono::steady_clock::now();
  ple.rows(token, out);
  stats_.ple_seconds += seconds_since(start);
}

int Runner::step(Sequence& sequence, int token, const float* ple_rows, const SamplingValues& sampling, double u,
                 bool sample) {
  check_feed(sequence, &token, 1, ple_rows, u);
  if (sample) sampler_inputs_.check(sampling, true);
  const auto start = std::chrono::steady_clock::now();
  const HostLoopPin pin(host_cpus_);
  stage_sampling(sampling, u, token, sequence.position(), sample, stream_.get());
  if (ple_rows) {
    std::memcpy(stage_.host<char>(kStagePleOffset), ple_rows, sizeof(float) * g_.ple_n_heads * g_.ple_head_dim);
  }
  // The session's own gather runs while the GPU works where a ring below the PLE layer orders it before the
  // rows' copy (DecodeProgram::ple_rows_late), else before the launch.
  PleGather* ple = sequence.ple();
  const bool late = ple && program_.ple_rows_late();
  if (ple && !late) gather_ple(*ple, token, stage_.host<float>(kStagePleOffset));
  // Ring numbers only move forward over the session's life (modulo 2^32, doorbell.cuh): a flag left from an
  // earlier token can never pass a wait.
  const int ring_base = ring_base_of(tokens_run_, g_.n_layer);
  bell_.begin_token(ring_base);
  sequence.begin_step();  // broken until the token completes
  refresh_cache();
  run_token(sampler_for(sample), ring_base, late ? ple : nullptr, token);
  sequence.end_step(1);
  ++tokens_run_;
  ++stats_.tokens;
  stats_.seconds += seconds_since(start);
  note_exchange();
  // The token is fed whatever its draw: a mask the sampler gave up waiting for voids the draw only.
  if (sample) sampler_inputs_.check_published(stage_.host<TokenStage>()->sampling);
  return sample ? *sampled_.host<volatile int>() : -1;
}

// The checks step() and feed() share, for n tokens from `tokens`.
void Runner::check_feed(const Sequence& sequence, const int* tokens, int n, const float* ple_rows, double u) const {
  check_bound(sequence);
  sequence.check_room(n);
  for (int i = 0; i < n; ++i) {
    STRATA_EXPECTS(tokens[i] >= 0 && tokens[i] < g_.n_vocab, InvalidArgument,
                   "token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                       std::to_string(g_.n_vocab) + ")");
  }
  const bool gathers = sequence.ple() != nullptr;
  STRATA_EXPECTS((ple_rows != nullptr) == (g_.ple_layer >= 0 && !gathers), InvalidArgument,
                 gathers             ? "this session gathers the PLE rows itself, yet PLE rows were given"
                 : g_.ple_layer >= 0 ? "this model's PLE layer needs the n-gram table rows of every token"
                                     : "this model has no PLE layer, yet PLE rows were given");
  STRATA_EXPECTS(u >= 0.0 && u < 1.0, InvalidArgument, "the draw u must lie in [0, 1), got " + std::to_string(u));
}

// What the token's end runs, from the sampling values staged for it.
Sampler Runner::sampler_for(bool sample) const {
  if (!sample) return Sampler::kNone;
  return kernels::picks_argmax(stage_.host<TokenStage>()->sampling) ? Sampler::kArgmax : Sampler::kDraw;
}

void Runner::stage_sampling(const SamplingValues& sampling, double u, int token, int at, bool sample,
                            cudaStream_t stream) {
  auto* st = stage_.host<TokenStage>();
  kernels::SampleParams& p = st->sampling;
  p = kernels::SampleParams{};
  p.temperature = sampling.temperature;
  p.top_p = sampling.top_p;
  p.min_p = sampling.min_p;
  p.u = u;
  p.repeat_penalty = sampling.repeat_penalty;
  p.top_k = sampling.top_k;
  p.n_seen = at + 1;
  if (sample) sampler_inputs_.stage(sampling, p, program_, stream);
  st->token = token;
  st->position = at;
}

int Runner::feed(Sequence& sequence, const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling,
                 double u, bool sample, float* all_logits) {
  return run_prompt(sequence, tokens, n, ple_rows, sampling, u, sample, all_logits, false);
}

void Runner::verify(Sequence& sequence, const int* tokens, int n, const float* ple_rows, float* all_logits) {
  STRATA_EXPECTS(n >= 1 && n <= sequence.verify_rows() && n <= prompt_chunk(), InvalidArgument,
                 "a verification step takes 1.." + std::to_string(std::min(sequence.verify_rows(), prompt_chunk())) +
                     " tokens (the session's verify rows " + std::to_string(sequence.verify_rows()) +
                     ", its prompt chunk " + std::to_string(prompt_chunk()) + "), got " + std::to_string(n));
  STRATA_EXPECTS(all_logits != nullptr, InvalidArgument, "a verification step needs a buffer for every row's logits");
  // A sequence whose KV streams cannot be a span (its state is in two arenas): its rows run as a prompt chunk.
  if (n > prompt_->max_step_rows()) {
    run_prompt(sequence, tokens, n, ple_rows, SamplingValues{}, 0.0, false, all_logits, true);
    return;
  }
  RowBatch batch(1);
  RowBatchSpan& span = batch[0];
  span.runner = this;
  span.sequence = &sequence;
  span.tokens = tokens;
  span.count = n;
  span.ple_rows = ple_rows;
  span.keep_rows = true;
  span.logits = all_logits;
  run(batch);
}

const float* Runner::gathered_ple(Sequence& sequence, const int* tokens, int n, const float* given,
                                  std::vector<float>& out, int first) {
  PleGather* ple = sequence.ple();
  if (!ple) return given;
  const std::size_t ple_width = static_cast<std::size_t>(g_.ple_n_heads) * g_.ple_head_dim;
  out.resize(std::max(out.size(), (first + n) * ple_width));
  float* rows = out.data() + first * ple_width;
  for (int i = 0; i < n; ++i) gather_ple(*ple, tokens[i], rows + i * ple_width);
  return rows;
}

void Runner::launch_step(const std::vector<long>& key, const std::function<void(cudaStream_t)>& enqueue) {
  if (options_.mode == DecodeMode::kUncaptured || !(prompt_->step_on_device() || prompt_->step_exchanges())) {
    enqueue(stream_.get());
    return;
  }
  auto found = step_graphs_.find(key);
  if (found == step_graphs_.end()) {
    if (step_graphs_.size() >= kMaxStepGraphs) {
      step_graphs_.erase(std::min_element(step_graphs_.begin(), step_graphs_.end(), [](const auto& a, const auto& b) {
        return a.second.last_launch < b.second.last_launch;
      }));
    }
    found = step_graphs_.emplace(key, StepGraph{CapturedGraph(stream_.get(), enqueue)}).first;
    ++stats_.batch_graphs;
  }
  found->second.last_launch = ++step_launches_;
  found->second.graph.launch(stream_.get());
}

// What run() refuses, before any state changes.
void Runner::check_batch(const RowBatch& batch) const {
  STRATA_EXPECTS(prompt_ != nullptr, InvalidArgument,
                 "steps of several rows run on the prompt path: this session has none (a prompt chunk of 0 tokens)");
  int rows = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const RowBatchSpan& span = batch[i];
    span.runner->check_feed(*span.sequence, span.tokens, span.count, span.ple_rows, span.u);
    if (span.sample) span.runner->sampler_inputs_.check(span.sampling, false);
    for (std::size_t j = 0; j < i; ++j) {
      STRATA_EXPECTS(batch[j].sequence != span.sequence, InvalidArgument,
                     "a step takes each session once; its spans " + std::to_string(j) + " and " + std::to_string(i) +
                         " are the same session");
    }
    rows += span.count;
  }
  STRATA_EXPECTS(!batch.empty() && rows <= prompt_->max_step_rows(), InvalidArgument,
                 "a step takes 1.." + std::to_string(prompt_->max_step_rows()) +
                     " rows (the leading session's prompt chunk, at most " + std::to_string(kMaxStepRows) +
                     "), got " + std::to_string(rows) + " in " + std::to_string(batch.size()) + " spans");
}

void Runner::run(RowBatch& batch) {
  check_batch(batch);
  const auto start = std::chrono::steady_clock::now();
  const std::size_t ple_width = static_cast<std::size_t>(g_.ple_n_heads) * g_.ple_head_dim;
  std::vector<RowsSpan> spans(batch.size());
  std::vector<Sampler> samplers(batch.size());
  std::vector<long> key;  // the spans' runners (by serial: never reused), rows, kept row states, samplers and
                          // steered layers
  int rows = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const RowBatchSpan& span = batch[i];
    spans[i] = RowsSpan{span.sequence->span(rows, span.count, span.keep_rows), span.sequence->history(),
                        span.sequence->position(), span.tokens, &span.sequence->steering()};
    rows += span.count;
  }
  for (RowBatchSpan& span : batch) {
    span.sequence->begin_step();  // broken until the step completes
    if (span.keep_rows) span.sequence->begin_verify(span.tokens, span.count);  // before the gather moves n-grams
  }
  if (g_.ple_layer >= 0) feed_rows_.resize(rows * ple_width);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    RowBatchSpan& span = batch[i];
    const int first = spans[i].state.first;
    // a sequence that gathers its rows writes them in their place; a caller's rows are copied there
    const float* ple = gathered_ple(*span.sequence, span.tokens, span.count, span.ple_rows, feed_rows_, first);
    if (ple && ple == span.ple_rows) {
      std::copy(ple, ple + span.count * ple_width, feed_rows_.begin() + first * ple_width);
    }
    const int last = span.sequence->position() + span.count - 1;
    span.runner->stage_sampling(span.sampling, span.u, span.tokens[span.count - 1], last, span.sample,
                                stream_.get());
    samplers[i] = span.runner->sampler_for(span.sample);
    key.insert(key.end(), {span.runner->serial_, span.count, span.keep_rows, static_cast<long>(samplers[i]),
                           span.sequence->steering().generation()});
  }
  prompt_->stage_step(spans.data(), static_cast<int>(spans.size()), g_.ple_layer >= 0 ? feed_rows_.data() : nullptr);
  refresh_cache();
  // Where the experts the cache lacks go through the doorbell (a captured step's only: PromptProgram::enqueue_step),
  // the step rings every MoE layer: its rings take the step's base, and its graph is another than the one whose
  // experts are all on the device.
  const bool exchanges = options_.mode != DecodeMode::kUncaptured && prompt_->step_exchanges();
  const int ring_base = ring_base_of(steps_run_, g_.n_layer);
  if (exchanges) rows_bell_->begin_token(ring_base);
  key.push_back(exchanges);
  // Each span's last row's logits become its own runner's, whose sampler draws from them: so each session's
  // logits() and logprobs() read its last row afterwards.
  launch_step(key, [&](cudaStream_t s) {
    prompt_->enqueue_step(s, exchanges);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int last = spans[i].state.first + spans[i].state.count - 1;
      batch[i].runner->program_.adopt_logits(prompt_->step_logits(last), samplers[i], s);
    }
  });
  if (exchanges) {
    ++steps_run_;  // ring numbers only move forward, whatever the step's end
    try {
      answer_step(rows, ring_base);
    } catch (...) {
      (void)cudaStreamSynchronize(stream_.get());  // let the device-side waits run out before anything moves
      throw;
    }
  }
  // After the answers: a copy into pageable memory (a caller's own array; the binding's default is page-locked)
  // returns only once it is done, so before them the host would wait for a step that waits for the host.
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].logits) continue;
    STRATA_CUDA_TRY(cudaMemcpyAsync(batch[i].logits, prompt_->step_logits(spans[i].state.first),
                                    sizeof(float) * batch[i].count * g_.n_vocab, cudaMemcpyDeviceToHost,
                                    stream_.get()));
  }
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream_.get()));
  if (exchanges) {
    note_exchange();
    rows_bell_->check_answers(ring_base, options_.timeout_seconds);
  }
  const double seconds = seconds_since(start);
  for (RowBatchSpan& span : batch) {
    span.sequence->end_step(span.count);
    span.runner->stats_.batch_tokens += span.count;
    span.runner->stats_.batch_seconds += seconds;
    span.sampled = span.sample ? *span.runner->sampled_.host<volatile int>() : -1;
  }
  ++stats_.batch_steps;
}

void Runner::truncate(Sequence& sequence, int position) {
  check_bound(sequence);
  sequence.truncate(position, stream_.get());
}

int Runner::run_prompt(Sequence& sequence, const int* tokens, int n, const float* ple_rows,
                       const SamplingValues& sampling, double u, bool sample, float* all_logits, bool row_states,
                       float* layer_states) {
  STRATA_EXPECTS(prompt_ != nullptr, InvalidArgument,
                 "this session has no prompt path (it was opened with a prompt chunk of 0 tokens)");
  check_feed(sequence, tokens, n, ple_rows, u);
  if (sample) sampler_inputs_.check(sampling, false);
  const auto start = std::chrono::steady_clock::now();
  sequence.begin_step();  // broken until the prompt completes
  if (row_states) sequence.begin_verify(tokens, n);  // before the gather below moves the n-gram state
  refresh_cache();
  const int chunk = prompt_->chunk(), ple_width = g_.ple_n_heads * g_.ple_head_dim;
  ple_rows = gathered_ple(sequence, tokens, n, ple_rows, feed_rows_);  // the whole prompt's rows at once
  const int position = sequence.position();
  struct Unrecorded {  // the program records nothing after this call, however it ends
    PromptProgram& program;
    ~Unrecorded() { program.record_layer_states(nullptr); }
  } unrecorded{*prompt_};
  for (int at = 0; at < n; at += chunk) {
    const int m = std::min(chunk, n - at);
    prompt_->record_layer_states(at + m == n ? layer_states : nullptr);  // the prompt's last token is this chunk's
    prompt_->run(tokens + at, m, position + at, ple_rows ? ple_rows + static_cast<long>(at) * ple_width : nullptr,
                 all_logits ? all_logits + static_cast<std::size_t>(at) * g_.n_vocab : nullptr, row_states,
                 stream_.get());
  }
  stage_sampling(sampling, u, tokens[n - 1], position + n - 1, sample, stream_.get());
  program_.end_prompt(sampler_for(sample), stream_.get());
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream_.get()));
  sequence.end_step(n);
  const PromptStats& p = prompt_->stats();
  stats_.prompt_tokens = p.tokens;
  stats_.prompt_chunks = p.chunks;
  stats_.prompt_staged_experts = p.staged_experts;
  stats_.prompt_cached_experts = p.cached_experts;
  stats_.prompt_pooled_experts = p.pooled_experts;
  stats_.prompt_staged_bytes = static_cast<long>(p.staged_bytes);
  stats_.prompt_seconds += seconds_since(start);
  return sample ? *sampled_.host<volatile int>() : -1;
}

void Runner::set_control_vectors(Sequence& sequence, const float* table, const std::uint8_t* layers) {
  check_bound(sequence);
  // The values are a copy into the table the graphs read; a layer that gains or loses its vector changes which
  // kernels' arguments name it, so the decode graphs are captured again. A step's graphs name the steered sets of
  // their spans in their keys (Runner::run).
  if (sequence.steering().set(table, layers, stream_.get())) schedule_.drop_graphs();
}

void Runner::layer_states(Sequence& sequence, const int* tokens, int n, const float* ple_rows, float* out) {
  STRATA_EXPECTS(prompt_ != nullptr, InvalidArgument,
                 "layer states come from the prompt path: this session has none (a prompt chunk of 0 tokens)");
  STRATA_EXPECTS(out != nullptr, InvalidArgument, "layer states need a buffer of n_layer * n_embd floats");
  const std::size_t floats = static_cast<std::size_t>(g_.n_layer) * g_.n_embd;
  if (!layer_states_) layer_states_ = std::make_unique<PinnedMapped>(sizeof(float) * floats);
  run_prompt(sequence, tokens, n, ple_rows, SamplingValues{}, 0.0, false, nullptr, false,
             layer_states_->device<float>());
  std::copy(layer_states_->host<float>(), layer_states_->host<float>() + floats, out);  // the stream has drained
}

void Runner::reset(Sequence& sequence) {
  check_bound(sequence);
  sequence.reset(stream_.get());
  stats_ = {};
  exchange_ = {};
  if (prompt_) prompt_->reset_stats();
}

void Runner::snapshot(Sequence& sequence, int slot) {
  check_bound(sequence);
  sequence.snapshot(slot, stream_.get());
}

void Runner::restore(Sequence& sequence, int slot) {
  check_bound(sequence);
  sequence.restore(slot, stream_.get());
}

TokenLogprobs Runner::logprobs(const Sequence& sequence, int token, int n, bool token_mask) {
  check_bound(sequence);
  STRATA_EXPECTS(!sequence.broken() && sequence.position() > 0, InvalidArgument,
                 "logprobs come after a completed step");
  STRATA_EXPECTS(token >= 0 && token < g_.n_vocab, InvalidArgument,
                 "token id " + std::to_string(token) + " is outside the vocabulary [0, " + std::to_string(g_.n_vocab) +
                     ")");
  STRATA_EXPECTS(n >= 0 && n <= kernels::kMaxLogprobs, InvalidArgument,
                 "logprobs: n must be in 0.." + std::to_string(kernels::kMaxLogprobs) + ", got " + std::to_string(n));
  program_.enqueue_logprobs(token, n, token_mask, stream_.get());
  kernels::Logprobs host;
  STRATA_CUDA_TRY(cudaMemcpyAsync(&host, program_.logprobs(), sizeof(host), cudaMemcpyDeviceToHost, stream_.get()));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream_.get()));
  return TokenLogprobs{host.token, std::vector<int>(host.ids, host.ids + n),
                       std::vector<double>(host.values, host.values + n)};
}

void Runner::logits(float* out) const {
  STRATA_CUDA_TRY(cudaMemcpy(out, program_.logits(), sizeof(float) * g_.n_vocab, cudaMemcpyDeviceToHost));
}

// The windows' fetched-bytes counter lives on the device (kernels add to it); read when stats are asked for,
// never on the token path.
const DecodeStats& Runner::stats(const Sequence& sequence) {
  check_bound(sequence);
  if (sequence.views().kv_streaming) stats_.kv_stream_bytes = static_cast<long>(sequence.kv_stream_bytes());
  return stats_;
}

}  // namespace strata
