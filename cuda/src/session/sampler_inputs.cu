#include "sampler_inputs.hpp"

#include <atomic>
#include <cmath>
#include <string>

#include "strata/error.hpp"

namespace strata {
namespace {

int mask_words_of(int n_vocab) { return (n_vocab + 31) / 32; }

// The publication's words (MaskPublication): the host writes `ready`, the device `late`.
constexpr std::size_t kReady = 0, kLate = 64, kPublicationBytes = 128;

std::vector<std::pair<int, float>> bias_pairs(const SamplingValues& s) {
  std::vector<std::pair<int, float>> pairs(static_cast<std::size_t>(s.n_bias));
  for (int i = 0; i < s.n_bias; ++i) pairs[i] = {s.bias_ids[i], s.bias_values[i]};
  return pairs;
}

}  // namespace

SamplerInputs::SamplerInputs(int n_vocab, double timeout_seconds)
    : n_vocab_(n_vocab),
      words_(mask_words_of(n_vocab)),
      timeout_seconds_(timeout_seconds),
      mask_(sizeof(std::int32_t) * mask_words_of(n_vocab)),
      publication_(kPublicationBytes) {}  // zeroed: ticket 0 never waits

kernels::MaskPublication SamplerInputs::publication() const noexcept {
  return {publication_.device<const unsigned>(kReady), publication_.device<unsigned>(kLate),
          static_cast<long long>(timeout_seconds_ * 1e9)};
}

void SamplerInputs::check(const SamplingValues& s, bool defers) const {
  STRATA_EXPECTS(std::isfinite(s.frequency_penalty) && std::isfinite(s.presence_penalty), InvalidArgument,
                 "frequency_penalty and presence_penalty must be finite");
  STRATA_EXPECTS(s.answer_start >= 0, InvalidArgument,
                 "answer_start must be >= 0, got " + std::to_string(s.answer_start));
  STRATA_EXPECTS(s.n_bias >= 0 && (s.n_bias == 0 || (s.bias_ids != nullptr && s.bias_values != nullptr)),
                 InvalidArgument, "a logit bias needs its ids and values");
  for (int i = 0; i < s.n_bias; ++i) {
    STRATA_EXPECTS(s.bias_ids[i] >= 0 && s.bias_ids[i] < n_vocab_, InvalidArgument,
                   "logit_bias: token " + std::to_string(s.bias_ids[i]) + " is outside the " +
                       std::to_string(n_vocab_) + " logits");
    STRATA_EXPECTS(std::isfinite(s.bias_values[i]), InvalidArgument,
                   "logit_bias: token " + std::to_string(s.bias_ids[i]) + "'s bias must be finite");
  }
  STRATA_EXPECTS(s.mask_ticket == 0 || (s.token_mask && defers), InvalidArgument,
                 s.token_mask ? "a token mask published after the launch (a mask ticket) is step()'s alone"
                              : "a mask ticket needs a token mask");
  if (s.token_mask && s.mask_ticket == 0) check_mask();  // a later mask is checked by its writer, before it publishes
}

void SamplerInputs::check_mask() const {
  // Only the vocabulary's bits count: the last word's bits past it name no logit.
  const auto* words = mask_.host<const std::uint32_t>();
  const int tail = n_vocab_ % 32;
  bool any = false;
  for (int w = 0; w < words_ && !any; ++w) {
    const std::uint32_t bits = w == words_ - 1 && tail ? words[w] & ((1u << tail) - 1u) : words[w];
    any = bits != 0;
  }
  STRATA_EXPECTS(any, InvalidArgument, "the token mask allows no token of the logits");
}

void SamplerInputs::stage(const SamplingValues& s, kernels::SampleParams& params, const DecodeProgram& program,
                          cudaStream_t stream) {
  params.frequency_penalty = s.frequency_penalty;
  params.presence_penalty = s.presence_penalty;
  params.answer_start = s.answer_start;
  params.masked = s.token_mask ? 1 : 0;
  params.mask_ticket = s.token_mask ? s.mask_ticket : 0u;
  params.biased = s.n_bias > 0 ? 1 : 0;
  if (s.n_bias == 0) return;  // the device keeps its bias, unread, for a later draw that sets the same again
  std::vector<std::pair<int, float>> pairs = bias_pairs(s);
  if (pairs == biased_) return;
  if (!bias_host_) bias_host_ = std::make_unique<PinnedMapped>(sizeof(float) * n_vocab_);  // zeroed
  // The copy before on this session's stream has completed: every call drains its stream before it returns.
  auto* dense = bias_host_->host<float>();
  for (const auto& [id, value] : biased_) dense[id] = 0.0f;
  for (const auto& [id, value] : pairs) dense[id] = value;  // an id given twice: the last, as numpy's out[ids] +=
  program.upload_bias(dense, stream);
  biased_ = std::move(pairs);
}

// The two sides hand the words over through a plain store and load on mapped memory (as the doorbell's): the fence
// orders the words' writes before the ticket's, the sampler's __threadfence_system orders its side.
void SamplerInputs::publish(unsigned ticket) const noexcept {
  std::atomic_thread_fence(std::memory_order_release);
  *publication_.host<volatile unsigned>(kReady) = ticket;
}

void SamplerInputs::check_published(const kernels::SampleParams& params) const {
  const unsigned ticket = params.mask_ticket;
  if (ticket == 0 || *publication_.host<const volatile unsigned>(kLate) != ticket) return;
  throw Error("the token mask of draw " + std::to_string(ticket) + " was not published within " +
              std::to_string(timeout_seconds_) + " s (the sampler's wait for it gave up; the token was fed, its draw "
              "is void)");
}

}  // namespace strata
