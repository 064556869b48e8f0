// How one token's GPU work is launched, written once for every program with the decode token's shape: begin,
// then per MoE layer pre[l] (which ends by ringing the doorbell) and post[l] (which starts with the device-side
// wait for the host's answer), then end. In every mode the host answers layer l's ring between pre[l] and
// post[l] (docs/session.md): uncaptured (launched kernel by kernel, per-stage CUDA event timing), per-layer
// graphs (the host launches pre[l], answers, launches post[l]), one graph per token (the host only answers).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "graph.hpp"
#include "strata/decode_session.hpp"

namespace strata {

// What end() runs after the LM head: nothing (the logits only), the argmax (greedy or top-k 1: no sort), or the
// whole sampler.
enum class Sampler { kNone = 0, kArgmax = 1, kDraw = 2 };

// The GPU work of one token as enqueue functions; each may be captured into a graph, so none allocates,
// synchronises or reads a per-token value other than through device memory.
class TokenProgram {
 public:
  virtual ~TokenProgram() = default;
  virtual int layers() const = 0;
  virtual void begin(cudaStream_t s) const = 0;
  virtual void pre(int layer, cudaStream_t s) const = 0;
  virtual void post(int layer, cudaStream_t s) const = 0;
  virtual void end(Sampler sampler, cudaStream_t s) const = 0;
};

// Device seconds of an uncaptured token's parts: begin and every pre[l]; every post[l] and end.
struct StageSeconds {
  double pre = 0.0;
  double post = 0.0;
};

class TokenSchedule {
 public:
  // `program` must outlive the schedule (captured graphs keep the program's pointers).
  TokenSchedule(const TokenProgram& program, DecodeMode mode);
  ~TokenSchedule();
  TokenSchedule(const TokenSchedule&) = delete;
  TokenSchedule& operator=(const TokenSchedule&) = delete;

  // Launches one token on `stream` (graph modes capture on first use), calls answer(l) for every layer in order
  // on this thread, and waits for the stream. Throws what answer() or CUDA throws, after the stream has drained.
  void run(Sampler sampler, cudaStream_t stream, const std::function<void(int layer)>& answer);

  // Mode uncaptured: the last token's stage seconds; zero in the graph modes (captures drop event records).
  StageSeconds stage_seconds() const;

  DecodeMode mode() const noexcept { return mode_; }
  bool captured() const noexcept;
  // Forgets every captured graph: the next run() captures again. For when what the program enqueues changes (a
  // layer that gains or loses a control vector), never on the token path.
  void drop_graphs() noexcept;

 private:
  class Timer;

  void capture(Sampler sampler, cudaStream_t stream);

  const TokenProgram& program_;
  DecodeMode mode_;
  std::unique_ptr<Timer> timer_;
  CapturedGraph begin_;
  std::vector<CapturedGraph> pre_, post_;
  std::array<std::unique_ptr<CapturedGraph>, 3> end_, whole_;  // indexed by the Sampler
};

}  // namespace strata
