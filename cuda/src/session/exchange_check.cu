#include "strata/exchange_check.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/doorbell.cuh"
#include "../runtime/device_buffer.hpp"
#include "../runtime/kernel_check_support.hpp"
#include "doorbell_host.hpp"
#include "graph.hpp"
#include "ring_answerer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"
#include "strata/expert_pool.hpp"

namespace strata::exchange_check {
namespace {

using kernel_check::support::upload;

// Stands in for a layer's GPU work before the router: reads the per-token factor from staging.
__global__ void scale_by_token(const float* __restrict__ x, const int* __restrict__ ring_base, int n_layer, int n,
                               float* __restrict__ out) {
  const float factor = static_cast<float>(*ring_base / n_layer + 1);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = x[i] * factor;
}

class Exchange {
 public:
  Exchange(cpu::ExpertPool& pool, int n_layer, int n, int k, const float* x, const std::int32_t* ids,
           const float* weights, const Faults& faults, double timeout_seconds)
      : n_layer_(n_layer),
        n_(n),
        k_(k),
        faults_(faults),
        ring_timeout_(host_ring_timeout(timeout_seconds)),
        answer_timeout_seconds_(timeout_seconds),
        bell_(n, k),
        answerer_(pool, bell_),
        x_(upload(x, sizeof(float) * n_layer * n)),
        ids_(upload(ids, sizeof(std::int32_t) * n_layer * k)),
        weights_(upload(weights, sizeof(float) * n_layer * k)),
        scaled_(sizeof(float) * n),
        answers_(sizeof(float) * n_layer * n) {
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  ~Exchange() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  void enqueue_pre(int layer, cudaStream_t stream) const {
    scale_by_token<<<8, 256, 0, stream>>>(x_.as<float>() + static_cast<long>(layer) * n_, bell_.ring_base_device(),
                                          n_layer_, n_, scaled_.as<float>());
    STRATA_CUDA_TRY(cudaGetLastError());
    if (layer == faults_.never_ring_layer) return;
    STRATA_CUDA_TRY(kernels::doorbell_publish(bell_.device_view(), scaled_.as<float>(),
                                              ids_.as<int>() + static_cast<long>(layer) * k_,
                                              weights_.as<float>() + static_cast<long>(layer) * k_,
                                              bell_.ring_base_device(), layer + 1, stream));
  }

  void enqueue_post(int layer, cudaStream_t stream) const {
    const auto timeout_ns = static_cast<long long>(answer_timeout_seconds_ * 1e9);
    STRATA_CUDA_TRY(kernels::doorbell_wait(bell_.device_view(), bell_.ring_base_device(), layer + 1, timeout_ns,
                                           bell_.status_device(), answers_.as<float>() + static_cast<long>(layer) * n_,
                                           stream));
  }

  void answer(int layer, int ring_base, ExchangeStats& stats) {
    if (layer == faults_.never_answer_layer) return;
    answerer_.answer(layer, ring_base + layer + 1, ring_timeout_, stats);
  }

  // One token in `mode`; graphs are captured on first use and replayed afterwards.
  void token(Mode mode, int t, ExchangeStats& stats) {
    const int ring_base = t * n_layer_;
    bell_.begin_token(ring_base);
    switch (mode) {
      case Mode::kUncaptured:
        for (int l = 0; l < n_layer_; ++l) {
          enqueue_pre(l, stream_);
          answer(l, ring_base, stats);
          enqueue_post(l, stream_);
        }
        break;
      case Mode::kLayerGraphs:
        capture_layers();
        for (int l = 0; l < n_layer_; ++l) {
          pre_[l].launch(stream_);
          answer(l, ring_base, stats);
          post_[l].launch(stream_);
        }
        break;
      case Mode::kTokenGraph:
        if (!whole_) {
          whole_ = std::make_unique<CapturedGraph>(stream_, [this](cudaStream_t s) {
            for (int l = 0; l < n_layer_; ++l) {
              enqueue_pre(l, s);
              enqueue_post(l, s);
            }
          });
        }
        whole_->launch(stream_);
        for (int l = 0; l < n_layer_; ++l) answer(l, ring_base, stats);
        break;
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));
    bell_.check_answers(ring_base, answer_timeout_seconds_);
  }

  void copy_answers(float* out) const {
    STRATA_CUDA_TRY(cudaMemcpy(out, answers_.as<float>(), answers_.bytes(), cudaMemcpyDeviceToHost));
  }

  // After a failure: let the device-side waits run out before buffers are freed.
  void drain() noexcept { (void)cudaStreamSynchronize(stream_); }

 private:
  void capture_layers() {
    if (!pre_.empty()) return;
    for (int l = 0; l < n_layer_; ++l) {
      pre_.emplace_back(stream_, [this, l](cudaStream_t s) { enqueue_pre(l, s); });
      post_.emplace_back(stream_, [this, l](cudaStream_t s) { enqueue_post(l, s); });
    }
  }

  int n_layer_, n_, k_;
  Faults faults_;
  std::chrono::nanoseconds ring_timeout_;
  double answer_timeout_seconds_;
  DoorbellHost bell_;
  RingAnswerer answerer_;
  DeviceBuffer x_, ids_, weights_, scaled_, answers_;
  cudaStream_t stream_ = nullptr;
  std::vector<CapturedGraph> pre_, post_;
  std::unique_ptr<CapturedGraph> whole_;
};

void check_arguments(int device, int n_layer, int n, int k, int tokens, double timeout_seconds) {
  require_device(device);
  STRATA_EXPECTS(n_layer > 0 && n > 0 && k > 0 && tokens > 0, InvalidArgument,
                 "exchange needs n_layer, n, k, tokens > 0");
  STRATA_EXPECTS(timeout_seconds > 0.0 && timeout_seconds <= 60.0, InvalidArgument,
                 "timeout must be in (0, 60] seconds, got " + std::to_string(timeout_seconds));
}

}  // namespace

Timing run(cpu::ExpertPool& pool, int device, Mode mode, int n_layer, int n, int k, const float* x,
           const std::int32_t* ids, const float* weights, int tokens, float* out, const Faults& faults,
           double timeout_seconds) {
  check_arguments(device, n_layer, n, k, tokens, timeout_seconds);
  DeviceScope scope(device);
  Exchange exchange(pool, n_layer, n, k, x, ids, weights, faults, timeout_seconds);
  ExchangeStats stats;
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int t = 0; t < tokens; ++t) {
      exchange.token(mode, t, stats);
      exchange.copy_answers(out + static_cast<long>(t) * n_layer * n);
    }
  } catch (...) {
    exchange.drain();
    throw;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Timing{seconds / tokens, stats.ring_wait_seconds / tokens, stats.pool_seconds / tokens, stats.rings};
}

}  // namespace strata::exchange_check
