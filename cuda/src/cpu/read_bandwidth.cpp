// The pool's read test: the host's read ceiling, measured by the team that runs the expert jobs (the workers, and
// the caller where it joins them).
//
// What the GPU box rewards (16-core Xeon, one NUMA node; a probe of 4/8/16 streams x 16/32/64-byte loads x
// prefetch x huge pages, 2026-12-01): huge pages above all (85 -> 114-148 GB/s at 15 workers, as the expert
// planes have them: numpy advises its large arrays), then eight full-width streams or a software prefetch
// (+10-20 %). A test on 4 KiB pages in fixed slices read 84 GB/s while pool jobs streamed 88-104, so the limit
// `strata bench` printed understated the machine; the test now reads the way the best job could.
#include "read_bandwidth.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "strata/error.hpp"

namespace strata::cpu {
namespace {

constexpr int64_t kHugePage = 2 << 20;

// Anonymous memory advised for transparent huge pages (where the kernel has them; elsewhere 4 KiB pages).
class ReadBuffer {
 public:
  explicit ReadBuffer(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory("read_bandwidth: cannot map " + std::to_string(bytes) + " bytes");
    data_ = static_cast<uint8_t*>(p);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the test reads 4 KiB pages
#endif
  }
  ~ReadBuffer() { munmap(data_, bytes_); }
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

struct ReadJob {
  uint8_t* base = nullptr;
  int64_t chunk = 0, chunks = 0;
  bool touch = false;
  bool prefetch = false;
  uint64_t (*read)(const uint8_t*, int64_t, bool) = nullptr;
  alignas(64) std::atomic<int64_t> next{0};
  std::vector<uint64_t> sinks;  // one per participant, so the reads cannot be optimised away
};

// Workers claim chunks as the pool's jobs claim their work items, so a slower core (one that also serves
// interrupts, say) delays the pass by a chunk, not by a fixed slice: the test measures what a balanced job can
// stream.
void read_job(void* context, int worker) {
  auto& job = *static_cast<ReadJob*>(context);
  for (int64_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
    uint8_t* at = job.base + c * job.chunk;
    if (job.touch) std::memset(at, static_cast<int>(c + 1), static_cast<size_t>(job.chunk));
    else job.sinks[worker] += job.read(at, job.chunk, job.prefetch);
  }
}

}  // namespace

double measure_read_bandwidth(WorkerTeam& team, Isa isa, int64_t bytes, int reps) {
  STRATA_EXPECTS(bytes >= (1 << 20) && reps >= 1, InvalidArgument,
                 "read_bandwidth: needs bytes >= 1 MiB and reps >= 1, found bytes=" + std::to_string(bytes) +
                     ", reps=" + std::to_string(reps));
  ReadJob job;
  // Whole huge pages per chunk where the buffer holds a few per worker.
  job.chunk = bytes / team.max_participants() >= 2 * kHugePage ? kHugePage : 64 * 1024;
  job.chunks = bytes / job.chunk;
  STRATA_EXPECTS(job.chunks >= team.max_participants(), InvalidArgument,
                 "read_bandwidth: buffer too small for the workers");
  const size_t total = static_cast<size_t>(job.chunk) * job.chunks;
  ReadBuffer buffer(total);
  job.base = buffer.data();
  job.read = isa == Isa::kAvx512 ? &read_slice_avx512 : &read_slice_avx2;
  job.sinks.assign(team.max_participants(), 0);
  job.touch = true;
  team.run(&read_job, &job);
  job.touch = false;
  double best = 0.0;
  for (const bool prefetch : {false, true}) {
    job.prefetch = prefetch;
    for (int r = 0; r < reps; ++r) {
      job.next.store(0, std::memory_order_relaxed);
      const auto t0 = std::chrono::steady_clock::now();
      team.run(&read_job, &job);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(total) / s);
    }
  }
  return best;
}

}  // namespace strata::cpu
