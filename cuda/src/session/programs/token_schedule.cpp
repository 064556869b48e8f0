#include "token_schedule.hpp"

#include <algorithm>

#include "strata/error.hpp"

namespace strata {

// CUDA events around the stages of an uncaptured token, read after the token has finished.
class TokenSchedule::Timer {
 public:
  explicit Timer(int layers) : layers_(layers), events_(4 * layers + 4) {
    for (cudaEvent_t& e : events_) STRATA_CUDA_TRY(cudaEventCreate(&e));
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }

  // Marks: 0 | begin | 1, then per layer 2+4l | pre | 3+4l ... 4+4l | post | 5+4l, then end ... 2+4L.
  void mark(int i, cudaStream_t s) const { STRATA_CUDA_TRY(cudaEventRecord(events_[i], s)); }

  StageSeconds seconds() const {
    StageSeconds st{between(0, 1), between(1 + 4 * layers_, 2 + 4 * layers_)};
    for (int l = 0; l < layers_; ++l) {
      st.pre += between(2 + 4 * l, 3 + 4 * l);
      st.post += between(4 + 4 * l, 5 + 4 * l);
    }
    return st;
  }

 private:
  double between(int from, int to) const {
    float ms = 0.0f;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return 1e-3 * ms;
  }

  int layers_;
  std::vector<cudaEvent_t> events_;
};

TokenSchedule::TokenSchedule(const TokenProgram& program, DecodeMode mode) : program_(program), mode_(mode) {
  if (mode_ == DecodeMode::kUncaptured) timer_ = std::make_unique<Timer>(program_.layers());
}

TokenSchedule::~TokenSchedule() = default;

void TokenSchedule::capture(Sampler sampler, cudaStream_t stream) {
  const int layers = program_.layers();
  const auto end = static_cast<std::size_t>(sampler);
  if (mode_ == DecodeMode::kLayerGraphs) {
    if (pre_.empty()) {
      begin_ = CapturedGraph(stream, [this](cudaStream_t s) { program_.begin(s); });
      for (int l = 0; l < layers; ++l) {
        pre_.emplace_back(stream, [this, l](cudaStream_t s) { program_.pre(l, s); });
        post_.emplace_back(stream, [this, l](cudaStream_t s) { program_.post(l, s); });
      }
    }
    if (!end_[end]) {
      end_[end] = std::make_unique<CapturedGraph>(stream, [this, sampler](cudaStream_t s) {
        program_.end(sampler, s);
      });
    }
  } else if (mode_ == DecodeMode::kTokenGraph && !whole_[end]) {
    whole_[end] = std::make_unique<CapturedGraph>(stream, [this, sampler, layers](cudaStream_t s) {
      program_.begin(s);
      for (int l = 0; l < layers; ++l) {
        program_.pre(l, s);
        program_.post(l, s);
      }
      program_.end(sampler, s);
    });
  }
}

void TokenSchedule::run(Sampler sampler, cudaStream_t stream, const std::function<void(int layer)>& answer) {
  const int layers = program_.layers();
  try {
    switch (mode_) {
      case DecodeMode::kUncaptured:
        timer_->mark(0, stream);
        program_.begin(stream);
        timer_->mark(1, stream);
        for (int l = 0; l < layers; ++l) {
          timer_->mark(2 + 4 * l, stream);
          program_.pre(l, stream);
          timer_->mark(3 + 4 * l, stream);
          answer(l);
          timer_->mark(4 + 4 * l, stream);
          program_.post(l, stream);
          timer_->mark(5 + 4 * l, stream);
        }
        program_.end(sampler, stream);
        timer_->mark(2 + 4 * layers, stream);
        break;
      case DecodeMode::kLayerGraphs:
        capture(sampler, stream);
        begin_.launch(stream);
        for (int l = 0; l < layers; ++l) {
          pre_[l].launch(stream);
          answer(l);
          post_[l].launch(stream);
        }
        end_[static_cast<std::size_t>(sampler)]->launch(stream);
        break;
      case DecodeMode::kTokenGraph:
        capture(sampler, stream);
        whole_[static_cast<std::size_t>(sampler)]->launch(stream);
        for (int l = 0; l < layers; ++l) answer(l);
        break;
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  } catch (...) {
    (void)cudaStreamSynchronize(stream);  // let the device-side waits run out before anything moves
    throw;
  }
}

StageSeconds TokenSchedule::stage_seconds() const { return timer_ ? timer_->seconds() : StageSeconds{}; }

void TokenSchedule::drop_graphs() noexcept {
  begin_ = CapturedGraph();
  pre_.clear();
  post_.clear();
  for (auto& g : end_) g.reset();
  for (auto& g : whole_) g.reset();
}

bool TokenSchedule::captured() const noexcept {
  return std::any_of(whole_.begin(), whole_.end(), [](const auto& g) { return g != nullptr; }) || !pre_.empty();
}

}  // namespace strata
