#include "strata/check/exchange_check.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <string>

#include "../kernels/doorbell.cuh"
#include "../kernels/launch.cuh"
#include "../runtime/device_buffer.hpp"
#include "../runtime/stream.hpp"
#include "../session/exchange/doorbell_host.hpp"
#include "../session/exchange/ring_answerer.hpp"
#include "../session/programs/token_schedule.hpp"
#include "kernel_check_support.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata::exchange_check {
namespace {

using kernel_check::support::upload;

// The token's factor t + 1, from the ring base the host staged (token t's is n_layer rings past the first
// token's `first_base`, modulo 2^32).
__global__ void token_factor(const int* __restrict__ ring_base, int first_base, int n_layer,
                             float* __restrict__ factor) {
  kernels::await_producers();
  kernels::release_consumers();
  *factor = static_cast<float>((static_cast<unsigned>(*ring_base) - static_cast<unsigned>(first_base)) / n_layer + 1);
}

__global__ void scale(const float* __restrict__ x, const float* __restrict__ factor, int n, float* __restrict__ out) {
  kernels::await_producers();
  kernels::release_consumers();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = x[i] * *factor;
}

// Stands in for the decode program: begin reads the per-token factor from staging, pre[l] scales layer l's x by
// it and publishes (unless the fault says never), post[l] waits for the answer into its row, end copies the
// token's answers out. Reads per-token values only through device memory, like the program it replaces.
class ExchangeProgram final : public TokenProgram {
 public:
  ExchangeProgram(const DoorbellHost& bell, int n_layer, int n, int k, const float* x, const std::int32_t* ids,
                  const float* weights, const Faults& faults, double timeout_seconds)
      : bell_(bell),
        first_base_(ring_base_of(faults.first_token, n_layer)),
        n_layer_(n_layer),
        n_(n),
        k_(k),
        faults_(faults),
        timeout_ns_(static_cast<long long>(timeout_seconds * 1e9)),
        x_(upload(x, sizeof(float) * n_layer * n)),
        ids_(upload(ids, sizeof(std::int32_t) * n_layer * k)),
        weights_(upload(weights, sizeof(float) * n_layer * k)),
        factor_(sizeof(float)),
        scaled_(sizeof(float) * n),
        answers_(sizeof(float) * n_layer * n),
        result_(sizeof(float) * n_layer * n) {}

  int layers() const override { return n_layer_; }

  void begin(cudaStream_t s) const override {
    STRATA_CUDA_TRY(kernels::launch(token_factor, 1, 1, 0, s, bell_.ring_base_device(), first_base_, n_layer_,
                                    factor_.as<float>()));
  }

  void pre(int layer, cudaStream_t s) const override {
    STRATA_CUDA_TRY(kernels::launch(scale, 8, 256, 0, s, x_.as<float>() + static_cast<long>(layer) * n_,
                                    factor_.as<float>(), n_, scaled_.as<float>()));
    if (layer == faults_.never_ring_layer) return;
    STRATA_CUDA_TRY(kernels::doorbell_publish(bell_.device_view(), scaled_.as<float>(),
                                              ids_.as<int>() + static_cast<long>(layer) * k_,
                                              weights_.as<float>() + static_cast<long>(layer) * k_,
                                              bell_.ring_base_device(), layer + 1, s));
  }

  void post(int layer, cudaStream_t s) const override {
    STRATA_CUDA_TRY(kernels::doorbell_wait(bell_.device_view(), bell_.ring_base_device(), layer + 1, timeout_ns_,
                                           bell_.status_device(), answers_.as<float>() + static_cast<long>(layer) * n_,
                                           s));
  }

  void end(Sampler /*sampler*/, cudaStream_t s) const override {
    STRATA_CUDA_TRY(cudaMemcpyAsync(result_.as<float>(), answers_.as<float>(), answers_.bytes(),
                                    cudaMemcpyDeviceToDevice, s));
  }

  void copy_result(float* out) const {
    STRATA_CUDA_TRY(cudaMemcpy(out, result_.as<float>(), result_.bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  const DoorbellHost& bell_;
  int first_base_, n_layer_, n_, k_;
  Faults faults_;
  long long timeout_ns_;
  DeviceBuffer x_, ids_, weights_, factor_, scaled_, answers_, result_;
};

void check_arguments(int device, int n_layer, int n, int k, int tokens, double timeout_seconds) {
  require_device(device);
  STRATA_EXPECTS(n_layer > 0 && n > 0 && k > 0 && tokens > 0, InvalidArgument,
                 "exchange needs n_layer, n, k, tokens > 0");
  STRATA_EXPECTS(timeout_seconds > 0.0 && timeout_seconds <= 60.0, InvalidArgument,
                 "timeout must be in (0, 60] seconds, got " + std::to_string(timeout_seconds));
}

}  // namespace

Timing run(cpu::ExpertPool& pool, int device, DecodeMode mode, int n_layer, int n, int k, const float* x,
           const std::int32_t* ids, const float* weights, int tokens, float* out, const Faults& faults,
           double timeout_seconds) {
  check_arguments(device, n_layer, n, k, tokens, timeout_seconds);
  DeviceScope scope(device);
  DoorbellHost bell(n, k, ring_base_of(faults.first_token, n_layer));
  RingAnswerer answerer(pool, bell);
  const ExchangeProgram program(bell, n_layer, n, k, x, ids, weights, faults, timeout_seconds);
  const Stream stream;
  TokenSchedule schedule(program, mode);
  const std::chrono::nanoseconds ring_timeout = host_ring_timeout(timeout_seconds);
  ExchangeStats stats;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < tokens; ++t) {
    const int ring_base = ring_base_of(faults.first_token + t, n_layer);
    bell.begin_token(ring_base);
    schedule.run(Sampler::kNone, stream.get(), [&](int layer) {
      if (layer != faults.never_answer_layer)
        answerer.answer(layer, kernels::ring_at(ring_base, layer + 1), ring_timeout, stats);
    });
    bell.check_answers(ring_base, timeout_seconds);
    program.copy_result(out + static_cast<long>(t) * n_layer * n);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Timing{seconds / tokens, stats.ring_wait_seconds / tokens, stats.pool_seconds / tokens, stats.rings};
}

}  // namespace strata::exchange_check
