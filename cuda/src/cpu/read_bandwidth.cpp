#include "read_bandwidth.hpp"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata/error.hpp"

namespace strata::cpu {
namespace {

struct ReadJob {
  uint8_t* base = nullptr;
  int64_t slice = 0;
  bool touch = false;
  std::vector<uint64_t> sinks;  // one per worker, so the reads cannot be optimised away
};

void read_job(void* context, int worker) {
  auto& job = *static_cast<ReadJob*>(context);
  uint8_t* mine = job.base + worker * job.slice;
  if (job.touch) {
    std::memset(mine, worker + 1, static_cast<size_t>(job.slice));
    return;
  }
  // Four streams (quarters of the slice) read side by side, 16-byte SSE2 loads (baseline x86-64): one
  // sequential stream leaves the core's fill buffers and prefetchers underused.
  const int64_t quarter = job.slice / 4 / 64 * 64;
  const __m128i* s[4];
  for (int q = 0; q < 4; ++q) s[q] = reinterpret_cast<const __m128i*>(mine + q * quarter);
  __m128i a[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
  for (int64_t i = 0; i < quarter / 16; i += 4) {
    for (int q = 0; q < 4; ++q) {
      const __m128i v = _mm_add_epi64(_mm_add_epi64(_mm_load_si128(s[q] + i), _mm_load_si128(s[q] + i + 1)),
                                      _mm_add_epi64(_mm_load_si128(s[q] + i + 2), _mm_load_si128(s[q] + i + 3)));
      a[q] = _mm_add_epi64(a[q], v);
    }
  }
  const __m128i total = _mm_add_epi64(_mm_add_epi64(a[0], a[1]), _mm_add_epi64(a[2], a[3]));
  job.sinks[worker] = static_cast<uint64_t>(_mm_cvtsi128_si64(total) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(total, total)));
}

}  // namespace

double measure_read_bandwidth(WorkerTeam& team, int64_t bytes, int reps) {
  STRATA_EXPECTS(bytes >= (1 << 20) && reps >= 1, InvalidArgument,
                 "read_bandwidth: needs bytes >= 1 MiB and reps >= 1, found bytes=" + std::to_string(bytes) +
                     ", reps=" + std::to_string(reps));
  ReadJob job;
  job.slice = (bytes / team.size()) / 4096 * 4096;
  STRATA_EXPECTS(job.slice > 0, InvalidArgument, "read_bandwidth: buffer too small for the workers");
  const size_t total = static_cast<size_t>(job.slice) * team.size();
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer(static_cast<uint8_t*>(std::aligned_alloc(4096, total)),
                                                        &std::free);
  if (!buffer) throw OutOfMemory("read_bandwidth: cannot allocate " + std::to_string(total) + " bytes");
  job.base = buffer.get();
  job.sinks.assign(team.size(), 0);
  job.touch = true;
  team.run(&read_job, &job);
  job.touch = false;
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    team.run(&read_job, &job);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(total) / s);
  }
  return best;
}

}  // namespace strata::cpu
