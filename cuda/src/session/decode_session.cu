#include "strata/decode_session.hpp"

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../runtime/device_buffer.hpp"
#include "../runtime/pinned_memory.hpp"
#include "decode_program.hpp"
#include "doorbell_host.hpp"
#include "graph.hpp"
#include "ring_answerer.hpp"
#include "strata/cpu_topology.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"
#include "strata/session_arena.hpp"

namespace strata {
namespace {

void check_geometry(const DecodeGeometry& g, const DecodeOptions& o) {
  auto positive = [](int v, const char* name) {
    STRATA_EXPECTS(v > 0, InvalidArgument, std::string("decode geometry: ") + name + " must be > 0, got " +
                                               std::to_string(v));
  };
  positive(g.n_layer, "n_layer");
  positive(g.n_embd, "n_embd");
  positive(g.n_vocab, "n_vocab");
  positive(g.n_expert, "n_expert");
  positive(g.n_expert_used, "n_expert_used");
  positive(g.shared_ff, "shared_ff");
  STRATA_EXPECTS(static_cast<int>(g.recurrent.size()) == g.n_layer, InvalidArgument,
                 "decode geometry: recurrent has " + std::to_string(g.recurrent.size()) + " entries for " +
                     std::to_string(g.n_layer) + " layers");
  STRATA_EXPECTS(g.hc_count == 0 || g.hc_rank > 0, InvalidArgument, "decode geometry: hc_rank must be > 0");
  STRATA_EXPECTS(g.ple_layer < 0 || (g.ple_layer < g.n_layer && g.hc_count > 0 && g.ple_n_heads > 0 &&
                                     g.ple_head_dim > 0 && g.ple_ngram > 0 && g.ple_conv_kernel > 1),
                 InvalidArgument, "decode geometry: the PLE layer " + std::to_string(g.ple_layer) +
                                      " needs hyper-connections and positive PLE sizes");
  STRATA_EXPECTS(g.indexer_head_dim == 0 || static_cast<int>(g.compress_ratios.size()) == g.n_layer,
                 InvalidArgument, "decode geometry: compress_ratios needs one entry per layer");
  STRATA_EXPECTS(o.timeout_seconds > 0.0 && o.timeout_seconds <= 600.0, InvalidArgument,
                 "timeout must be in (0, 600] seconds, got " + std::to_string(o.timeout_seconds));
}

SessionShape session_shape(const DecodeGeometry& g) {
  SessionShape s;
  s.recurrent = g.recurrent;
  s.n_embd = g.n_embd;
  s.n_vocab = g.n_vocab;
  s.n_head_kv = g.n_head_kv;
  s.head_dim = g.head_dim;
  s.ssm_k_heads = g.ssm_k_heads;
  s.ssm_v_heads = g.ssm_v_heads;
  s.ssm_head_k_dim = g.ssm_head_k_dim;
  s.ssm_head_v_dim = g.ssm_head_v_dim;
  s.ssm_conv_kernel = g.ssm_conv_kernel;
  s.indexer_head_dim = g.indexer_head_dim;
  s.n_ple_layers = g.ple_layer >= 0 ? 1 : 0;
  s.ple_history = g.ple_layer >= 0 ? (g.ple_conv_kernel - 1) * g.ple_ngram : 0;
  s.hc_count = g.hc_count;
  return s;
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

// CUDA events around the stages of an uncaptured token, summed into the stats after it finished.
class StageTimer {
 public:
  explicit StageTimer(int marks) : events_(marks) {
    for (cudaEvent_t& e : events_) STRATA_CUDA_TRY(cudaEventCreate(&e));
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  ~StageTimer() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  void mark(int i, cudaStream_t s) const { STRATA_CUDA_TRY(cudaEventRecord(events_[i], s)); }
  double seconds(int from, int to) const {
    float ms = 0.0f;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return 1e-3 * ms;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

}  // namespace

struct DecodeSession::Impl {
  Impl(const DeviceWeights& weights, cpu::ExpertPool& pool, const DecodeGeometry& geometry,
       const DecodeOptions& options)
      : g(geometry),
        options(options),
        scope(options.device),
        arena(options.device, plan_session(session_shape(g), options.context, options.kv)),
        bell(g.n_embd, g.n_expert_used),
        answerer(pool, bell),
        stage(DecodeProgram::stage_bytes(g)),
        sampled(sizeof(int)),
        program(weights, g, arena, options.kv, program_io()),
        timer(4 * g.n_layer + 4),
        ring_timeout(host_ring_timeout(options.timeout_seconds)) {
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Impl() {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }

  ProgramIo program_io() const {
    ProgramIo io;
    io.host_stage = stage.host<void>();
    io.bell = bell.device_view();
    io.ring_base = bell.ring_base_device();
    io.wait_status = bell.status_device();
    io.answer_timeout_ns = static_cast<long long>(options.timeout_seconds * 1e9);
    io.sampled = sampled.device<int>();
    return io;
  }

  void capture(bool sample) {
    if (options.mode == DecodeMode::kLayerGraphs && pre.empty()) {
      begin = CapturedGraph(stream, [this](cudaStream_t s) { program.begin(s); });
      for (int l = 0; l < g.n_layer; ++l) {
        pre.emplace_back(stream, [this, l](cudaStream_t s) { program.pre(l, s); });
        post.emplace_back(stream, [this, l](cudaStream_t s) { program.post(l, s); });
      }
    }
    if (options.mode == DecodeMode::kLayerGraphs && !end[sample]) {
      end[sample] = std::make_unique<CapturedGraph>(stream, [this, sample](cudaStream_t s) { program.end(sample, s); });
    }
    if (options.mode == DecodeMode::kTokenGraph && !whole[sample]) {
      whole[sample] = std::make_unique<CapturedGraph>(stream, [this, sample](cudaStream_t s) {
        program.begin(s);
        for (int l = 0; l < g.n_layer; ++l) {
          program.pre(l, s);
          program.post(l, s);
        }
        program.end(sample, s);
      });
    }
  }

  void answer(int layer, int ring_base) { answerer.answer(layer, ring_base + layer + 1, ring_timeout, exchange); }

  void run_token(bool sample, int ring_base) {
    switch (options.mode) {
      case DecodeMode::kUncaptured:
        timer.mark(0, stream);
        program.begin(stream);
        timer.mark(1, stream);
        for (int l = 0; l < g.n_layer; ++l) {
          timer.mark(2 + 4 * l, stream);
          program.pre(l, stream);
          timer.mark(3 + 4 * l, stream);
          answer(l, ring_base);
          timer.mark(4 + 4 * l, stream);
          program.post(l, stream);
          timer.mark(5 + 4 * l, stream);
        }
        program.end(sample, stream);
        timer.mark(2 + 4 * g.n_layer, stream);
        break;
      case DecodeMode::kLayerGraphs:
        capture(sample);
        begin.launch(stream);
        for (int l = 0; l < g.n_layer; ++l) {
          pre[l].launch(stream);
          answer(l, ring_base);
          post[l].launch(stream);
        }
        end[sample]->launch(stream);
        break;
      case DecodeMode::kTokenGraph:
        capture(sample);
        whole[sample]->launch(stream);
        for (int l = 0; l < g.n_layer; ++l) answer(l, ring_base);
        break;
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
    bell.check_answers(ring_base, options.timeout_seconds);
    if (options.mode == DecodeMode::kUncaptured) {
      double pre_s = timer.seconds(0, 1), post_s = 0.0;
      for (int l = 0; l < g.n_layer; ++l) {
        pre_s += timer.seconds(2 + 4 * l, 3 + 4 * l);
        post_s += timer.seconds(4 + 4 * l, 5 + 4 * l);
      }
      post_s += timer.seconds(1 + 4 * g.n_layer, 2 + 4 * g.n_layer);
      stats.gpu_pre_seconds += pre_s;
      stats.gpu_post_seconds += post_s;
    }
  }

  int step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample) {
    STRATA_EXPECTS(!broken, Error, "an earlier step failed midway; reset() the session before the next step");
    STRATA_EXPECTS(position < context(), InvalidArgument,
                   "the sequence is full: " + std::to_string(context()) + " tokens of context are used; reset()");
    STRATA_EXPECTS(token >= 0 && token < g.n_vocab, InvalidArgument,
                   "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                       std::to_string(g.n_vocab) + ")");
    STRATA_EXPECTS((ple_rows != nullptr) == (g.ple_layer >= 0), InvalidArgument,
                   g.ple_layer >= 0 ? "this model's PLE layer needs the n-gram table rows of every token"
                                    : "this model has no PLE layer, yet PLE rows were given");
    STRATA_EXPECTS(u >= 0.0 && u < 1.0, InvalidArgument, "the draw u must lie in [0, 1), got " + std::to_string(u));
    const auto start = std::chrono::steady_clock::now();
    const HostLoopPin pin(host_cpus);
    auto* st = stage.host<TokenStage>();
    st->sampling = {sampling.temperature, sampling.top_p, sampling.min_p, u, sampling.repeat_penalty,
                    sampling.top_k, position + 1};
    st->token = token;
    st->position = position;
    if (ple_rows) {
      std::memcpy(stage.host<char>(kStagePleOffset), ple_rows, sizeof(float) * g.ple_n_heads * g.ple_head_dim);
    }
    // Ring numbers only grow over the session's life: a flag left from an earlier token can never pass a wait.
    const int ring_base = static_cast<int>(tokens_run * g.n_layer);
    bell.begin_token(ring_base);
    broken = true;  // until the token completes
    try {
      run_token(sample, ring_base);
    } catch (...) {
      (void)cudaStreamSynchronize(stream);  // let the device-side waits run out before anything moves
      throw;
    }
    broken = false;
    ++tokens_run;
    ++position;
    ++stats.tokens;
    stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats.ring_wait_seconds = exchange.ring_wait_seconds;
    stats.pool_seconds = exchange.pool_seconds;
    stats.rings = exchange.rings;
    return sample ? *sampled.host<volatile int>() : -1;
  }

  void reset() {
    (void)cudaStreamSynchronize(stream);
    arena.reset();
    position = 0;
    broken = false;
    stats = {};
    exchange = {};
  }

  int context() const noexcept { return options.context; }

  DecodeGeometry g;
  DecodeOptions options;
  std::vector<int> host_cpus = host_loop_cpus();
  DeviceScope scope;
  SessionArena arena;
  DoorbellHost bell;
  RingAnswerer answerer;
  PinnedMapped stage, sampled;
  DecodeProgram program;
  StageTimer timer;
  std::chrono::nanoseconds ring_timeout;
  cudaStream_t stream = nullptr;
  CapturedGraph begin;
  std::vector<CapturedGraph> pre, post;
  std::array<std::unique_ptr<CapturedGraph>, 2> end, whole;
  int position = 0;
  long tokens_run = 0;
  bool broken = false;
  DecodeStats stats;
  ExchangeStats exchange;
};

DecodeSession::DecodeSession(const DeviceWeights& weights, cpu::ExpertPool& pool, const DecodeGeometry& geometry,
                             const DecodeOptions& options) {
  check_geometry(geometry, options);
  require_device(options.device);
  impl_ = std::make_unique<Impl>(weights, pool, geometry, options);
}

DecodeSession::~DecodeSession() = default;

int DecodeSession::step(int token, const float* ple_rows, const SamplingValues& sampling, double u, bool sample) {
  DeviceScope scope(impl_->options.device);
  return impl_->step(token, ple_rows, sampling, u, sample);
}

void DecodeSession::logits(float* out) const {
  DeviceScope scope(impl_->options.device);
  STRATA_CUDA_TRY(cudaMemcpy(out, impl_->program.logits(), sizeof(float) * impl_->g.n_vocab, cudaMemcpyDeviceToHost));
}

void DecodeSession::streams(float* out) const {
  DeviceScope scope(impl_->options.device);
  const std::size_t count = static_cast<std::size_t>(std::max(impl_->g.hc_count, 1)) * impl_->g.n_embd;
  STRATA_CUDA_TRY(cudaMemcpy(out, impl_->program.streams(), sizeof(float) * count, cudaMemcpyDeviceToHost));
}

void DecodeSession::reset() {
  DeviceScope scope(impl_->options.device);
  impl_->reset();
}

int DecodeSession::position() const noexcept { return impl_->position; }
int DecodeSession::context() const noexcept { return impl_->context(); }
DecodeMode DecodeSession::mode() const noexcept { return impl_->options.mode; }
bool DecodeSession::captured() const noexcept {
  return impl_->whole[0] || impl_->whole[1] || !impl_->pre.empty();
}
const DecodeStats& DecodeSession::stats() const noexcept { return impl_->stats; }

}  // namespace strata
