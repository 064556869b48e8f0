// A captured CUDA graph, instantiated once and replayed: captures bake in pointers, never values, so
// every per-token value a graph reads must live in staging memory rewritten before each replay.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "strata/error.hpp"

namespace strata {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  // Records what `enqueue(stream)` puts on `stream` and instantiates it.
  template <class Enqueue>
  CapturedGraph(cudaStream_t stream, Enqueue&& enqueue) {
    STRATA_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      enqueue(stream);
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph);
      if (graph) (void)cudaGraphDestroy(graph);
      throw;
    }
    STRATA_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
    (void)cudaGraphDestroy(graph);
    STRATA_CUDA_TRY(status);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  CapturedGraph(CapturedGraph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
  CapturedGraph& operator=(CapturedGraph&& other) noexcept {
    std::swap(exec_, other.exec_);
    return *this;
  }
  ~CapturedGraph() {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
  }

  void launch(cudaStream_t stream) const { STRATA_CUDA_TRY(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace strata
