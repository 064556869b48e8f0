// The GPU <-> CPU expert exchange of a decode token, on its own: per MoE layer the GPU publishes x, ids and
// weights and rings; the host answers with the CPU pool; the GPU consumes the answer. Run through the session's
// own token schedule in its three modes, with a stand-in program in place of the decode program, so tests can
// prove the modes agree, that per-token staging reaches captured graphs, and that a layer that never rings (or
// is never answered) is named. Not for the token path: it allocates.
#pragma once

#include <cstdint>

#include "strata/decode_session.hpp"

namespace strata::cpu {
class ExpertPool;
}

namespace strata::exchange_check {

// Fault injection for tests: a layer whose ring is never published / whose ring is never answered; and the
// session-lifetime index of the first token, so that a test can run the tokens where ring numbers wrap.
struct Faults {
  int never_ring_layer = -1;
  int never_answer_layer = -1;
  std::uint64_t first_token = 0;
};

struct Timing {
  double seconds_per_token = 0.0;
  double ring_wait_seconds = 0.0;  // per token
  double pool_seconds = 0.0;       // per token
  long rings = 0;
};

// For token t and layer l the GPU publishes x[l] * (t + 1) (the factor comes from per-token staging) with
// ids[l], weights[l]; out[t][l] receives what it got back: sum_j weights[l][j] * expert_{ids[l][j]}(x).
// x: [n_layer][n], ids / weights: [n_layer][k], out: [tokens][n_layer][n]. Throws strata::Error naming the
// layer on a missing answer (the GPU waits `timeout_seconds` for each) or a missing ring (the host waits 3x).
Timing run(cpu::ExpertPool& pool, int device, DecodeMode mode, int n_layer, int n, int k, const float* x,
           const std::int32_t* ids, const float* weights, int tokens, float* out, const Faults& faults,
           double timeout_seconds);

}  // namespace strata::exchange_check
