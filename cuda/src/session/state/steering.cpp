#include "steering.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <utility>

#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

// The generations of every sequence's steered sets, from one counter: two different sets never share one.
long next_generation() {
  static std::atomic<long> generation{0};
  return ++generation;
}

}  // namespace

Steering::Steering(int device, int n_layer, int n_embd)
    : device_(device), n_layer_(n_layer), n_embd_(n_embd), table_(0), layers_(n_layer, 0) {}

bool Steering::set(const float* table, const std::uint8_t* layers, cudaStream_t s) {
  const std::size_t n = n_embd_;
  std::vector<std::uint8_t> wanted(n_layer_, 0);
  int count = 0;
  for (int l = 0; l < n_layer_; ++l) {
    if (!layers[l]) continue;
    wanted[l] = 1;
    ++count;
    const float* row = table + l * n;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isfinite(row[i])) continue;
      std::ostringstream value;
      value << row[i];
      throw InvalidArgument("control vector for layer " + std::to_string(l) + ": value " + value.str() +
                            " at index " + std::to_string(i) + " is not finite (it would turn every later state "
                            "NaN or infinite)");
    }
  }
  const bool changed = wanted != layers_;
  if (count > 0 && table_.bytes() == 0) {
    const std::size_t bytes = sizeof(float) * n * n_layer_;
    require_free_memory(bytes, device_, "the session's control vector table would");
    table_ = DeviceBuffer(bytes);
  }
  if (table_.bytes() > 0) {
    // Zeros where a layer has no vector: a step's rows read their sequence's row of the table on every layer any of
    // the step's sequences steers, and a zero adds nothing (kernels::StreamAddend).
    std::vector<float> rows(n * n_layer_, 0.0f);
    for (int l = 0; l < n_layer_; ++l) {
      if (wanted[l]) std::copy(table + l * n, table + (l + 1) * n, rows.begin() + l * n);
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(s));
    STRATA_CUDA_TRY(cudaMemcpyAsync(table_.as<float>(), rows.data(), sizeof(float) * rows.size(),
                                    cudaMemcpyHostToDevice, s));
    STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  }
  layers_ = std::move(wanted);
  count_ = count;
  if (changed) generation_ = count > 0 ? next_generation() : 0;
  return changed;
}

std::vector<int> Steering::layers() const {
  std::vector<int> out;
  for (int l = 0; l < n_layer_; ++l) {
    if (layers_[l]) out.push_back(l);
  }
  return out;
}

const float* Steering::vector(int layer) const noexcept {
  return layers_[layer] ? table_.as<float>() + static_cast<std::size_t>(layer) * n_embd_ : nullptr;
}

}  // namespace strata
