#include "strata/decode_session.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../kernels/sample.cuh"
#include "../runtime/device_buffer.hpp"
#include "programs/decode_program.hpp"
#include "programs/program_inputs.hpp"
#include "programs/prompt_program.hpp"
#include "runner.hpp"
#include "state/sequence.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_cache.hpp"
#include "strata/ple_gather.hpp"
#include "strata/session_layout.hpp"

namespace strata {
namespace {

void check_options(const DecodeOptions& o) {
  STRATA_EXPECTS(o.timeout_seconds > 0.0 && o.timeout_seconds <= 600.0, InvalidArgument,
                 "timeout must be in (0, 600] seconds, got " + std::to_string(o.timeout_seconds));
  STRATA_EXPECTS(o.snapshots >= 0 && o.snapshots <= kMaxSnapshots, InvalidArgument,
                 "snapshots must be in 0.." + std::to_string(kMaxSnapshots) + ", got " + std::to_string(o.snapshots));
  STRATA_EXPECTS(o.prompt_chunk >= 0, InvalidArgument,
                 "prompt chunk must be >= 0 tokens (0: no prompt path), got " + std::to_string(o.prompt_chunk));
  STRATA_EXPECTS(o.verify_rows >= 0 && o.verify_rows <= kMaxVerifyRows, InvalidArgument,
                 "verify rows must be in 0.." + std::to_string(kMaxVerifyRows) + ", got " +
                     std::to_string(o.verify_rows));
  STRATA_EXPECTS(o.verify_rows == 0 || o.prompt_chunk >= o.verify_rows, InvalidArgument,
                 "verification steps run on the prompt path in one chunk: verify rows " +
                     std::to_string(o.verify_rows) + " need a prompt chunk of at least that many tokens, got " +
                     std::to_string(o.prompt_chunk));
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

// Tokens of `context` rounded up to whole KV pages, as the arena holds them.
int whole_pages(int context) { return (context + kKvPageTokens - 1) / kKvPageTokens * kKvPageTokens; }

}  // namespace

// A session is one sequence and the runner that steps it (docs/architecture.md, "Sequences and the runner"),
// over the program tables of its context. Destroyed in reverse: the runner (its stream drained) before the
// sequence whose state its work writes.
struct DecodeSession::Impl {
  Impl(const DeviceWeights& weights, cpu::ExpertPool& pool, const ModelGeometry& geometry,
       const DecodeOptions& options, ExpertCache* cache, ExpertStaging* staging, PleGather* ple)
      : g(geometry),
        options(options),
        shared{&weights, &pool, cache, staging},
        scope(options.device),
        tables(weights, g, whole_pages(options.context)),
        sequence(options.device, g, tables.tensors(),
                 SequenceOptions{options.context, options.kv, options.snapshots, options.kv_streaming,
                                 options.verify_rows},
                 ple),
        runner(pool, g, options, tables, sequence, cache, staging) {}

  // What a batched step's sessions must share: their rows run on one session's programs.
  struct Shared {
    const DeviceWeights* weights;
    const cpu::ExpertPool* pool;
    const ExpertCache* cache;
    const ExpertStaging* staging;
    bool operator==(const Shared& o) const {
      return weights == o.weights && pool == o.pool && cache == o.cache && staging == o.staging;
    }
  };

  ModelGeometry g;
  DecodeOptions options;
  Shared shared;
  DeviceScope scope;
  ProgramTables tables;
  Sequence sequence;
  Runner runner;
};

std::size_t decode_scratch_bytes(const ModelGeometry& geometry, int context, std::size_t sampler_bytes) {
  check_geometry(geometry);
  STRATA_EXPECTS(context >= 1, InvalidArgument, "context must be >= 1 token, got " + std::to_string(context));
  const int tokens = whole_pages(context);
  return DecodeProgram::scratch_bytes(geometry, tokens, sampler_bytes) + ProgramTables::bytes(geometry, tokens) +
         Sequence::history_bytes(tokens);
}

std::size_t prompt_scratch_bytes(const ModelGeometry& geometry, int chunk, int context, KvStorage kv,
                                 bool kv_streaming) {
  check_geometry(geometry);
  STRATA_EXPECTS(context >= 1, InvalidArgument, "context must be >= 1 token, got " + std::to_string(context));
  return PromptProgram::scratch_bytes(geometry, chunk, whole_pages(context), kv, kv_streaming);
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
  return impl_->runner.step(impl_->sequence, token, ple_rows, sampling, u, sample);
}

int DecodeSession::feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u,
                        bool sample, float* all_logits) {
  DeviceScope scope(impl_->options.device);
  return impl_->runner.feed(impl_->sequence, tokens, n, ple_rows, sampling, u, sample, all_logits);
}

void DecodeSession::step_batch(DecodeSession* const* sessions, int n, const int* tokens,
                               const float* const* ple_rows, const SamplingValues* sampling, const double* u,
                               bool sample, int* out) {
  STRATA_EXPECTS(n >= 1 && sessions != nullptr, InvalidArgument,
                 "a batched step needs at least one session, got " + std::to_string(n));
  std::vector<StepPart> parts(n);
  for (int i = 0; i < n; ++i) {
    StepPart& part = parts[i];
    part.tokens = tokens + i;
    part.ple_rows = ple_rows ? ple_rows[i] : nullptr;
    part.sample = sample;
    part.sampling = sampling[i];
    part.u = u[i];
  }
  step_rows(sessions, parts.data(), n);
  for (int i = 0; i < n; ++i) out[i] = parts[i].sampled;
}

void DecodeSession::step_rows(DecodeSession* const* sessions, StepPart* parts, int n) {
  STRATA_EXPECTS(n >= 1 && sessions != nullptr && parts != nullptr, InvalidArgument,
                 "a step of several sessions' rows needs at least one session, got " + std::to_string(n));
  const Impl& lead = *sessions[0]->impl_;
  const std::string key = sessions[0]->batch_key();
  // The spans go in the order of their sessions' runners (by serial), and the first of them leads: a captured
  // step is keyed by its members in order, on its leader, and a server gathers a batch in the order its members'
  // steps arrive (131 orders in 132 batches of eight clients), so each batch would capture a graph of its own.
  std::vector<int> order(n), span_of(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return sessions[a]->impl_->runner.serial() < sessions[b]->impl_->runner.serial();
  });
  for (int j = 0; j < n; ++j) span_of[order[j]] = j;
  RowBatch batch(n);
  for (int i = 0; i < n; ++i) {
    Impl& m = *sessions[i]->impl_;
    const StepPart& part = parts[i];
    const std::string which = "session " + std::to_string(i) + " of the step ";
    STRATA_EXPECTS(!m.options.kv_streaming, InvalidArgument, which + "streams its KV; batched steps read it in VRAM");
    STRATA_EXPECTS(sessions[i]->batch_key() == key && !key.empty(), InvalidArgument,
                   which + "runs on other weights, pool, expert cache, staging or GPU than session 0, or holds " +
                       std::to_string(m.sequence.context()) + " tokens of KV in another format (session 0: " +
                       std::to_string(lead.sequence.context()) +
                       "): batched sessions share all of these (batch_key)");
    STRATA_EXPECTS(part.tokens != nullptr, InvalidArgument, which + "has no tokens");
    if (part.verify) {
      STRATA_EXPECTS(part.count >= 1 && part.count <= m.sequence.verify_rows(), InvalidArgument,
                     which + "verifies 1.." + std::to_string(m.sequence.verify_rows()) +
                         " tokens (its verify rows), got " + std::to_string(part.count));
      STRATA_EXPECTS(part.logits != nullptr && !part.sample, InvalidArgument,
                     which + "verifies: its rows' logits need a buffer, and nothing is sampled");
    } else {
      STRATA_EXPECTS(part.count == 1, InvalidArgument,
                     which + "steps one token (a part of more is a verification), got " + std::to_string(part.count));
    }
    RowBatchSpan& span = batch[span_of[i]];
    span.runner = &m.runner;
    span.sequence = &m.sequence;
    span.tokens = part.tokens;
    span.count = part.count;
    span.ple_rows = part.ple_rows;
    span.keep_rows = part.verify;
    span.logits = part.logits;
    span.sample = part.sample;
    span.sampling = part.sampling;
    span.u = part.u;
  }
  DeviceScope scope(lead.options.device);
  sessions[order[0]]->impl_->runner.run(batch);
  for (int i = 0; i < n; ++i) parts[i].sampled = batch[span_of[i]].sampled;
}

void DecodeSession::verify(const int* tokens, int n, const float* ple_rows, float* all_logits) {
  DeviceScope scope(impl_->options.device);
  impl_->runner.verify(impl_->sequence, tokens, n, ple_rows, all_logits);
}

void DecodeSession::truncate(int position) {
  DeviceScope scope(impl_->options.device);
  impl_->runner.truncate(impl_->sequence, position);
}

int DecodeSession::verify_rows() const noexcept { return impl_->sequence.verify_rows(); }

std::int32_t* DecodeSession::token_mask_words() const noexcept { return impl_->runner.sampler_inputs().mask_words(); }

int DecodeSession::token_mask_size() const noexcept { return impl_->runner.sampler_inputs().mask_size(); }

void DecodeSession::publish_token_mask(unsigned ticket) const noexcept {
  impl_->runner.sampler_inputs().publish(ticket);
}

void DecodeSession::check_token_mask() const { impl_->runner.sampler_inputs().check_mask(); }

void DecodeSession::set_control_vectors(const float* table, const std::uint8_t* layers) {
  STRATA_EXPECTS(table != nullptr && layers != nullptr, InvalidArgument,
                 "control vectors take a table of n_layer * n_embd floats and n_layer layer flags");
  DeviceScope scope(impl_->options.device);
  impl_->runner.set_control_vectors(impl_->sequence, table, layers);
}

std::vector<int> DecodeSession::control_vector_layers() const { return impl_->sequence.steering().layers(); }

void DecodeSession::layer_states(const int* tokens, int n, const float* ple_rows, float* out) {
  DeviceScope scope(impl_->options.device);
  impl_->runner.layer_states(impl_->sequence, tokens, n, ple_rows, out);
}

void DecodeSession::logits(float* out) const {
  DeviceScope scope(impl_->options.device);
  impl_->runner.logits(out);
}

void DecodeSession::reset() {
  DeviceScope scope(impl_->options.device);
  impl_->runner.reset(impl_->sequence);
}

TokenLogprobs DecodeSession::logprobs(int token, int n, bool token_mask) const {
  DeviceScope scope(impl_->options.device);
  return impl_->runner.logprobs(impl_->sequence, token, n, token_mask);
}

void DecodeSession::snapshot(int slot) {
  DeviceScope scope(impl_->options.device);
  impl_->runner.snapshot(impl_->sequence, slot);
}

void DecodeSession::restore(int slot) {
  DeviceScope scope(impl_->options.device);
  impl_->runner.restore(impl_->sequence, slot);
}

std::string DecodeSession::batch_key() const {
  const Impl& m = *impl_;
  if (m.runner.prompt_chunk() == 0 || m.options.kv_streaming) return {};
  const auto address = [](const void* p) { return std::to_string(reinterpret_cast<std::uintptr_t>(p)); };
  return address(m.shared.weights) + "/" + address(m.shared.pool) + "/" + address(m.shared.cache) + "/" +
         address(m.shared.staging) + "/gpu" + std::to_string(m.options.device) + "/context" +
         std::to_string(m.sequence.context()) + "/kv" + std::to_string(static_cast<int>(m.options.kv));
}

int DecodeSession::position() const noexcept { return impl_->sequence.position(); }
int DecodeSession::context() const noexcept { return impl_->sequence.context(); }
int DecodeSession::prompt_chunk() const noexcept { return impl_->runner.prompt_chunk(); }
DecodeMode DecodeSession::mode() const noexcept { return impl_->options.mode; }
bool DecodeSession::captured() const noexcept { return impl_->runner.captured(); }
const DecodeStats& DecodeSession::stats() const {
  DeviceScope scope(impl_->options.device);
  return impl_->runner.stats(impl_->sequence);
}

}  // namespace strata
