#include "strata/decode_session.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../runtime/device_buffer.hpp"
#include "../runtime/pinned_memory.hpp"
#include "../runtime/stream.hpp"
#include "../kernels/sample.cuh"
#include "programs/decode_program.hpp"
#include "exchange/doorbell_host.hpp"
#include "programs/prompt_program.hpp"
#include "exchange/ring_answerer.hpp"
#include "strata/cpu_topology.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_cache.hpp"
#include "strata/expert_pool.hpp"
#include "strata/expert_staging.hpp"
#include "strata/ple_gather.hpp"
#include "strata/session_arena.hpp"
#include "programs/token_schedule.hpp"

namespace strata {
namespace {

void check_options(const DecodeOptions& o) {
  STRATA_EXPECTS(o.timeout_seconds > 0.0 && o.timeout_seconds <= 600.0, InvalidArgument,
                 "timeout must be in (0, 600] seconds, got " + std::to_string(o.timeout_seconds));
  STRATA_EXPECTS(o.snapshots >= 0 && o.snapshots <= kMaxSnapshots, InvalidArgument,
                 "snapshots must be in 0.." + std::to_string(kMaxSnapshots) + ", got " + std::to_string(o.snapshots));
  STRATA_EXPECTS(o.prompt_chunk >= 0, InvalidArgument,
                 "prompt chunk must be >= 0 tokens (0: no prompt path), got " + std::to_string(o.prompt_chunk));
}

void check_deferral(const DecodeOptions& o, const ModelGeometry& g) {
  STRATA_EXPECTS(o.defer_experts >= 0 && o.defer_experts < g.n_expert_used, InvalidArgument,
                 "defer_experts must be in 0.." + std::to_string(g.n_expert_used - 1) + " (below the " +
                     std::to_string(g.n_expert_used) + " routed experts of a token), got " +
                     std::to_string(o.defer_experts));
}

void check_cache(const ExpertCache& cache, const ModelGeometry& g, int device) {
  STRATA_EXPECTS(cache.device() == device, InvalidArgument,
                 "the expert cache is on GPU " + std::to_string(cache.device()) + ", the session on GPU " +
                     std::to_string(device));
  STRATA_EXPECTS(cache.layers() <= g.n_layer, InvalidArgument,
                 "the expert cache has " + std::to_string(cache.layers()) + " layers, the model " +
                     std::to_string(g.n_layer));
  for (int l = 0; l < cache.layers(); ++l) {
    STRATA_EXPECTS(cache.slots(l) == 0 || cache.n_expert(l) == g.n_expert, InvalidArgument,
                   "the expert cache's layer " + std::to_string(l) + " has " + std::to_string(cache.n_expert(l)) +
                       " experts, the model " + std::to_string(g.n_expert));
  }
}

void check_ple(const PleGather& ple, const ModelGeometry& g) {
  STRATA_EXPECTS(g.ple_layer >= 0 && ple.n_heads() == g.ple_n_heads && ple.head_dim() == g.ple_head_dim,
                 InvalidArgument,
                 "the PLE gather reads " + std::to_string(ple.n_heads()) + " rows of " +
                     std::to_string(ple.head_dim()) + " values per token; this model's PLE layer takes " +
                     (g.ple_layer >= 0 ? std::to_string(g.ple_n_heads) + " of " + std::to_string(g.ple_head_dim)
                                       : std::string("none")));
}

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

}  // namespace

struct DecodeSession::Impl {
  Impl(const DeviceWeights& weights, cpu::ExpertPool& pool, const ModelGeometry& geometry,
       const DecodeOptions& options, ExpertCache* cache, ExpertStaging* staging, PleGather* ple)
      : g(geometry),
        cache(cache),
        ple(ple),
        options(options),
        scope(options.device),
        arena(options.device, plan_session(g, options.context, options.kv, options.snapshots, options.kv_streaming)),
        bell(g.n_embd, g.n_expert_used),
        answerer(pool, bell, cache, deferral()),
        stage(DecodeProgram::stage_bytes(g)),
        sampled(sizeof(int)),
        program(weights, g, arena, options.kv, program_io(), cache),
        schedule(program, options.mode),
        ring_timeout(host_ring_timeout(options.timeout_seconds)) {
    if (options.prompt_chunk > 0) {
      prompt = std::make_unique<PromptProgram>(program, g, options.device, options.prompt_chunk, staging, cache,
                                               &pool, cpu_share(pool, staging));
    }
  }

  ProgramIo program_io() const {
    ProgramIo io;
    io.host_stage = stage.host<void>();
    io.bell = bell.device_view();
    io.ring_base = bell.ring_base_device();
    io.wait_status = bell.status_device();
    io.answer_timeout_ns = static_cast<long long>(options.timeout_seconds * 1e9);
    io.sampled = sampled.device<int>();
    io.deferral = deferral();
    return io;
  }

  ExpertDeferral deferral() const { return {options.defer_experts, g.n_layer}; }

  // The cache's replacement between tokens: its map changes here only, ahead of the token on this stream.
  void refresh_cache() {
    if (!cache) return;
    for (const ExpertMove& move : cache->between_tokens(stream.get())) {
      if (static_cast<int>(stats.expert_copies.size()) <= move.layer) stats.expert_copies.resize(g.n_layer, 0);
      ++stats.expert_copies[move.layer];
      stats.expert_copy_bytes += static_cast<long>(cache->expert_bytes(move.layer));
    }
  }

  // `late_ple`: the token whose PLE rows are gathered here, after the launch and before any ring is answered
  // (-1: none); the GPU copies them up at the PLE layer, behind its wait for a ring below it.
  void run_token(Sampler sampler, int ring_base, int late_ple) {
    schedule.run(sampler, stream.get(), [this, ring_base, late_ple](int layer) {
      if (layer == 0 && late_ple >= 0) gather_ple(late_ple, stage.host<float>(kStagePleOffset));
      answerer.answer(layer, kernels::ring_at(ring_base, layer + 1), ring_timeout, exchange);
    });
    bell.check_answers(ring_base, options.timeout_seconds);
    const StageSeconds stages = schedule.stage_seconds();
    stats.gpu_pre_seconds += stages.pre;
    stats.gpu_post_seconds += stages.post;
  }

  // The session's own gather of `token`'s PLE rows into `out`, timed (ple is set).
  void gather_ple(int token, float* out) {
    const auto start = std::chrono::steady_clock::now();
    ple->rows(token, out);
    stats.ple_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  int step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample) {
    check_feed(&token, 1, ple_rows, u);
    const auto start = std::chrono::steady_clock::now();
    const HostLoopPin pin(host_cpus);
    stage_sampling(sampling, u, token, position);
    if (ple_rows) {
      std::memcpy(stage.host<char>(kStagePleOffset), ple_rows, sizeof(float) * g.ple_n_heads * g.ple_head_dim);
    }
    // The session's own gather runs while the GPU works where a ring below the PLE layer orders it before the
    // rows' copy (DecodeProgram::ple_rows_late), else before the launch.
    const bool late = ple && program.ple_rows_late();
    if (ple && !late) gather_ple(token, stage.host<float>(kStagePleOffset));
    // Ring numbers only move forward over the session's life (modulo 2^32, doorbell.cuh): a flag left from an
    // earlier token can never pass a wait.
    const int ring_base = ring_base_of(tokens_run, g.n_layer);
    bell.begin_token(ring_base);
    broken = true;  // until the token completes
    refresh_cache();
    run_token(sampler_for(sample), ring_base, late ? token : -1);
    broken = false;
    ++tokens_run;
    ++position;
    ++stats.tokens;
    stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats.ring_wait_seconds = exchange.ring_wait_seconds;
    stats.pool_seconds = exchange.pool_seconds;
    stats.rings = exchange.rings;
    stats.expert_hits = exchange.hits;
    stats.expert_misses = exchange.misses;
    return sample ? *sampled.host<volatile int>() : -1;
  }

  // The share of a small chunk's staged bytes the pool takes so that both finish together: its host read rate
  // against the staging's PCIe rate, both measured (0: no CPU share, or a pool without the rows for it).
  double cpu_share(cpu::ExpertPool& pool, const ExpertStaging* staging) const {
    if (!options.prompt_cpu || !staging || staging->copy_rate() <= 0.0 ||
        pool.max_rows() < 2 * g.n_expert) {
      return 0.0;
    }
    const double host = pool.read_bandwidth(std::int64_t{1} << 28, 2);
    return host / (host + staging->copy_rate());
  }

  // The checks step() and feed() share, for n tokens from `tokens`.
  void check_feed(const int* tokens, int n, const float* ple_rows, double u) const {
    STRATA_EXPECTS(!broken, Error, "an earlier step failed midway; reset() the session before the next step");
    STRATA_EXPECTS(n >= 1 && position + n <= context(), InvalidArgument,
                   "the sequence is full: " + std::to_string(position) + " of " + std::to_string(context()) +
                       " tokens of context are used and " + std::to_string(n) + " more were fed; reset()");
    for (int i = 0; i < n; ++i) {
      STRATA_EXPECTS(tokens[i] >= 0 && tokens[i] < g.n_vocab, InvalidArgument,
                     "token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                         std::to_string(g.n_vocab) + ")");
    }
    STRATA_EXPECTS((ple_rows != nullptr) == (g.ple_layer >= 0 && !ple), InvalidArgument,
                   ple                ? "this session gathers the PLE rows itself, yet PLE rows were given"
                   : g.ple_layer >= 0 ? "this model's PLE layer needs the n-gram table rows of every token"
                                      : "this model has no PLE layer, yet PLE rows were given");
    STRATA_EXPECTS(u >= 0.0 && u < 1.0, InvalidArgument, "the draw u must lie in [0, 1), got " + std::to_string(u));
  }

  // What the token's end runs, from the sampling values staged for it.
  Sampler sampler_for(bool sample) const {
    if (!sample) return Sampler::kNone;
    return kernels::picks_argmax(stage.host<TokenStage>()->sampling) ? Sampler::kArgmax : Sampler::kDraw;
  }

  void stage_sampling(const SamplingValues& sampling, double u, int token, int at) {
    auto* st = stage.host<TokenStage>();
    st->sampling = {sampling.temperature, sampling.top_p, sampling.min_p, u, sampling.repeat_penalty,
                    sampling.top_k, at + 1};
    st->token = token;
    st->position = at;
  }

  int feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u, bool sample,
           float* all_logits) {
    STRATA_EXPECTS(prompt != nullptr, InvalidArgument,
                   "this session has no prompt path (it was opened with a prompt chunk of 0 tokens)");
    check_feed(tokens, n, ple_rows, u);
    const auto start = std::chrono::steady_clock::now();
    broken = true;  // until the prompt completes
    refresh_cache();
    const int chunk = prompt->chunk(), ple_width = g.ple_n_heads * g.ple_head_dim;
    if (ple) {  // the whole prompt's rows at once, as the caller's would come (the prompt path is not the token's)
      feed_rows.resize(static_cast<std::size_t>(n) * ple_width);
      for (int i = 0; i < n; ++i) gather_ple(tokens[i], feed_rows.data() + static_cast<std::size_t>(i) * ple_width);
      ple_rows = feed_rows.data();
    }
    for (int at = 0; at < n; at += chunk) {
      const int m = std::min(chunk, n - at);
      prompt->run(tokens + at, m, position + at, ple_rows ? ple_rows + static_cast<long>(at) * ple_width : nullptr,
                  all_logits ? all_logits + static_cast<std::size_t>(at) * g.n_vocab : nullptr, stream.get());
    }
    stage_sampling(sampling, u, tokens[n - 1], position + n - 1);
    program.end_prompt(sampler_for(sample), stream.get());
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    broken = false;
    position += n;
    const PromptStats& p = prompt->stats();
    stats.prompt_tokens = p.tokens;
    stats.prompt_chunks = p.chunks;
    stats.prompt_staged_experts = p.staged_experts;
    stats.prompt_cached_experts = p.cached_experts;
    stats.prompt_pooled_experts = p.pooled_experts;
    stats.prompt_staged_bytes = static_cast<long>(p.staged_bytes);
    stats.prompt_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return sample ? *sampled.host<volatile int>() : -1;
  }

  void reset() {
    (void)cudaStreamSynchronize(stream.get());
    arena.reset();
    program.reset_windows(stream.get());
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    position = 0;
    broken = false;
    stats = {};
    exchange = {};
    if (prompt) prompt->reset_stats();
    snapshot_position.assign(options.snapshots, -1);
    if (ple) ple->reset();
  }

  TokenLogprobs logprobs(int token, int n) {
    STRATA_EXPECTS(!broken && position > 0, InvalidArgument, "logprobs come after a completed step");
    STRATA_EXPECTS(token >= 0 && token < g.n_vocab, InvalidArgument,
                   "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                       std::to_string(g.n_vocab) + ")");
    STRATA_EXPECTS(n >= 0 && n <= kernels::kMaxLogprobs, InvalidArgument,
                   "logprobs: n must be in 0.." + std::to_string(kernels::kMaxLogprobs) + ", got " + std::to_string(n));
    program.enqueue_logprobs(token, n, stream.get());
    kernels::Logprobs host;
    STRATA_CUDA_TRY(cudaMemcpyAsync(&host, program.logprobs(), sizeof(host), cudaMemcpyDeviceToHost, stream.get()));
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return TokenLogprobs{host.token, std::vector<int>(host.ids, host.ids + n),
                         std::vector<double>(host.values, host.values + n)};
  }

  void snapshot(int slot) {
    STRATA_EXPECTS(!broken, Error, "an earlier step failed midway; reset() the session before a snapshot");
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    arena.snapshot(slot);  // checks the slot
    snapshot_position[slot] = position;
    if (ple) ple_saved[slot] = ple->previous();
  }

  void restore(int slot) {
    STRATA_EXPECTS(slot >= 0 && slot < options.snapshots && snapshot_position[slot] >= 0, InvalidArgument,
                   "state snapshot slot " + std::to_string(slot) + " holds no snapshot (the session has " +
                       std::to_string(options.snapshots) + " slots)");
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    arena.restore(slot);
    position = snapshot_position[slot];
    if (ple) ple->set_previous(ple_saved[slot]);
    broken = false;  // every state a later token reads is the snapshot's or indexed below its position
  }

  int context() const noexcept { return options.context; }

  // The windows' fetched-bytes counter lives on the device (kernels add to it); read when stats are asked for,
  // never on the token path.
  void read_stream_bytes() {
    if (arena.layout().kv_streaming) stats.kv_stream_bytes = static_cast<long>(program.stream_bytes());
  }

  ModelGeometry g;
  ExpertCache* cache;
  PleGather* ple;  // null: the caller passes each token's PLE rows
  DecodeOptions options;
  std::vector<int> host_cpus = host_loop_cpus();
  DeviceScope scope;
  SessionArena arena;
  DoorbellHost bell;
  RingAnswerer answerer;
  PinnedMapped stage, sampled;
  DecodeProgram program;
  TokenSchedule schedule;
  std::chrono::nanoseconds ring_timeout;
  std::unique_ptr<PromptProgram> prompt;  // options.prompt_chunk > 0
  Stream stream;  // after every buffer: destroyed (and drained) before any of them is freed
  int position = 0;
  long tokens_run = 0;
  bool broken = false;
  DecodeStats stats;
  ExchangeStats exchange;
  std::vector<int> snapshot_position = std::vector<int>(options.snapshots, -1);  // per slot; -1: empty
  std::vector<std::vector<std::int64_t>> ple_saved = std::vector<std::vector<std::int64_t>>(options.snapshots);
  std::vector<float> feed_rows;  // feed(): the prompt's PLE rows, where the session gathers them
};

std::size_t decode_scratch_bytes(const ModelGeometry& geometry, int context, std::size_t sampler_bytes) {
  check_geometry(geometry);
  STRATA_EXPECTS(context >= 1, InvalidArgument, "context must be >= 1 token, got " + std::to_string(context));
  const int pages = (context + kKvPageTokens - 1) / kKvPageTokens;
  return DecodeProgram::scratch_bytes(geometry, pages * kKvPageTokens, sampler_bytes);
}

std::size_t prompt_scratch_bytes(const ModelGeometry& geometry, int chunk, int context, KvStorage kv,
                                 bool kv_streaming) {
  check_geometry(geometry);
  STRATA_EXPECTS(context >= 1, InvalidArgument, "context must be >= 1 token, got " + std::to_string(context));
  const int pages = (context + kKvPageTokens - 1) / kKvPageTokens;
  return PromptProgram::scratch_bytes(geometry, chunk, pages * kKvPageTokens, kv, kv_streaming);
}

std::size_t sampler_workspace_bytes(int n_vocab) {
  std::size_t bytes = 0;
  STRATA_CUDA_TRY(kernels::sample_scratch_bytes(n_vocab, &bytes));
  return bytes;
}

DecodeSession::DecodeSession(const DeviceWeights& weights, cpu::ExpertPool& pool, const ModelGeometry& geometry,
                             const DecodeOptions& options, ExpertCache* cache, ExpertStaging* staging,
                             PleGather* ple) {
  check_geometry(geometry);
  check_options(options);
  check_deferral(options, geometry);
  require_device(options.device);
  if (cache) check_cache(*cache, geometry, options.device);
  if (ple) check_ple(*ple, geometry);
  impl_ = std::make_unique<Impl>(weights, pool, geometry, options, cache, staging, ple);
}

DecodeSession::~DecodeSession() = default;

int DecodeSession::step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample) {
  DeviceScope scope(impl_->options.device);
  return impl_->step(token, ple_rows, sampling, u, sample);
}

int DecodeSession::feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u,
                        bool sample, float* all_logits) {
  DeviceScope scope(impl_->options.device);
  return impl_->feed(tokens, n, ple_rows, sampling, u, sample, all_logits);
}

void DecodeSession::logits(float* out) const {
  DeviceScope scope(impl_->options.device);
  STRATA_CUDA_TRY(cudaMemcpy(out, impl_->program.logits(), sizeof(float) * impl_->g.n_vocab, cudaMemcpyDeviceToHost));
}

void DecodeSession::reset() {
  DeviceScope scope(impl_->options.device);
  impl_->reset();
}

TokenLogprobs DecodeSession::logprobs(int token, int n) const {
  DeviceScope scope(impl_->options.device);
  return impl_->logprobs(token, n);
}

void DecodeSession::snapshot(int slot) {
  DeviceScope scope(impl_->options.device);
  impl_->snapshot(slot);
}

void DecodeSession::restore(int slot) {
  DeviceScope scope(impl_->options.device);
  impl_->restore(slot);
}

int DecodeSession::position() const noexcept { return impl_->position; }
int DecodeSession::context() const noexcept { return impl_->context(); }
int DecodeSession::prompt_chunk() const noexcept { return impl_->prompt ? impl_->prompt->chunk() : 0; }
DecodeMode DecodeSession::mode() const noexcept { return impl_->options.mode; }
bool DecodeSession::captured() const noexcept { return impl_->schedule.captured(); }
const DecodeStats& DecodeSession::stats() const {
  DeviceScope scope(impl_->options.device);
  impl_->read_stream_bytes();
  return impl_->stats;
}

}  // namespace strata
