#include "strata/check/pool_check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../cpu/activation.hpp"
#include "../cpu/expert_hidden.hpp"
#include "../cpu/expert_layout.hpp"
#include "../cpu/item_claims.hpp"
#include "strata/error.hpp"
#include "vnni_emulated.hpp"

namespace strata::pool_check {
namespace {

void check_matrix(const cpu::ExpertMatrix& m, int64_t expert, const char* what) {
  cpu::validate_matrix(m, m.rows, m.cols, what);
  STRATA_EXPECTS(expert >= 0 && expert < m.n_expert, InvalidArgument,
                 std::string(what) + ": expert " + std::to_string(expert) + " is outside 0.." +
                     std::to_string(m.n_expert - 1));
}

// x as a layer job gives it: quantized to q8_32 only when a matrix that reads it is quantized, so a float
// kernel that read the q8_32 form would fail the checks.
cpu::QuantizedRows job_input(const float* x, int64_t cols, bool quantized) {
  cpu::QuantizedRows xq(1, cols);
  if (quantized) cpu::quantize_blocks(x, 0, cols / 32, xq.row(0));
  return xq;
}

// y = W x of `expert` through `kernel` on consecutive ranges of rows_per_call rows (0: all in one call).
void run_rows(cpu::RowsKernel kernel, const cpu::ExpertMatrix& m, int64_t expert, const float* x, float* y,
              int64_t rows_per_call, const char* what) {
  STRATA_EXPECTS(rows_per_call >= 0, InvalidArgument,
                 std::string(what) + ": rows_per_call must be >= 0 (0 = all rows), found " +
                     std::to_string(rows_per_call));
  cpu::QuantizedRows xq = job_input(x, m.cols, !m.is_float);
  const int64_t step = rows_per_call == 0 ? m.rows : rows_per_call;
  for (int64_t r0 = 0; r0 < m.rows; r0 += step)
    kernel(cpu::expert_rows(m, expert), r0, std::min(m.rows, r0 + step), cpu::Activation{x, xq.row(0)}, 1.0f, y + r0);
}

}  // namespace

void expert_matvec(cpu::Isa isa, const cpu::ExpertMatrix& m, int64_t expert, const float* x, float* y,
                   int64_t rows_per_call) {
  check_matrix(m, expert, "expert_matvec");
  run_rows(cpu::matrix_kernel(cpu::resolve_isa(isa), m), m, expert, x, y, rows_per_call, "expert_matvec");
}

void emulated_vnni_matvec(const cpu::ExpertMatrix& m, int64_t expert, const float* x, float* y,
                          int64_t rows_per_call) {
  check_matrix(m, expert, "emulated_vnni_matvec");
  STRATA_EXPECTS(!m.is_float, InvalidArgument,
                 "emulated_vnni_matvec: a float matrix has no integer kernel; quantized forms only");
  STRATA_EXPECTS(cpu::cpu_has_avx2(), InvalidArgument,
                 "emulated_vnni_matvec: the emulated kernels are built for AVX2 + FMA + F16C, which this CPU lacks");
  run_rows(emulated_vnni_kernel(m.form), m, expert, x, y, rows_per_call, "emulated_vnni_matvec");
}

void expert_hidden(cpu::Isa isa, const cpu::ExpertMatrix& gate, const cpu::ExpertMatrix& up, int64_t expert,
                   const float* x, float* h) {
  check_matrix(gate, expert, "expert_hidden gate");
  check_matrix(up, expert, "expert_hidden up");
  STRATA_EXPECTS(gate.rows == up.rows && gate.cols == up.cols, InvalidArgument,
                 "expert_hidden: gate is " + std::to_string(gate.rows) + " x " + std::to_string(gate.cols) +
                     ", up " + std::to_string(up.rows) + " x " + std::to_string(up.cols) + "; they must agree");
  const cpu::Isa resolved = cpu::resolve_isa(isa);
  cpu::QuantizedRows xq = job_input(x, gate.cols, !gate.is_float || !up.is_float);
  cpu::expert_hidden(cpu::matrix_kernel(resolved, gate), cpu::expert_rows(gate, expert),
                     cpu::matrix_kernel(resolved, up), cpu::expert_rows(up, expert), 0, gate.rows,
                     cpu::Activation{x, xq.row(0)}, h);
}

double time_rows(cpu::Isa isa, const cpu::ExpertMatrix& m, const float* x, int64_t rows, int64_t calls) {
  check_matrix(m, 0, "time_rows");
  STRATA_EXPECTS(rows >= 1 && rows <= m.rows, InvalidArgument,
                 "time_rows: rows must be in 1.." + std::to_string(m.rows) + ", found " + std::to_string(rows));
  STRATA_EXPECTS(calls >= 1, InvalidArgument, "time_rows: calls must be >= 1, found " + std::to_string(calls));
  cpu::QuantizedRows xq = job_input(x, m.cols, !m.is_float);
  const cpu::RowsKernel kernel = cpu::matrix_kernel(cpu::resolve_isa(isa), m);
  const cpu::Activation activation{x, xq.row(0)};
  std::vector<float> y(static_cast<size_t>(rows));
  kernel(cpu::expert_rows(m, 0), 0, rows, activation, 1.0f, y.data());  // the code and expert 0 warm
  const auto start = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < calls; ++c) kernel(cpu::expert_rows(m, c % m.n_expert), 0, rows, activation, 1.0f, y.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void claim_order(int64_t items, int parts, int p, int64_t* order) {
  STRATA_EXPECTS(items >= 0 && parts >= 1 && p >= 0 && p < parts, InvalidArgument,
                 "claim_order: items >= 0, parts >= 1 and 0 <= p < parts, found " + std::to_string(items) + ", " +
                     std::to_string(parts) + ", " + std::to_string(p));
  cpu::ItemClaims claims(parts);
  claims.reset(items, parts);
  int64_t n = 0;
  claims.each(p, [&](int64_t i) {
    if (n < items) order[n] = i;
    ++n;
  });
  STRATA_EXPECTS(n == items, Error, "claim_order: " + std::to_string(n) + " claims of " + std::to_string(items));
}

void claim_items(int64_t items, int parts, int participants, const int* delays_us, int* claimed_by, int* claims) {
  STRATA_EXPECTS(items >= 0 && parts >= 1 && participants >= 1 && participants <= 256, InvalidArgument,
                 "claim_items: items >= 0, parts >= 1 and 1..256 participants, found " + std::to_string(items) + ", " +
                     std::to_string(parts) + ", " + std::to_string(participants));
  cpu::ItemClaims handed(participants);
  handed.reset(items, parts);
  std::vector<std::atomic<int>> counts(items);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < participants; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(delays_us[t]));
      handed.each(t, [&](int64_t i) {
        claimed_by[i] = t;
        counts[i].fetch_add(1, std::memory_order_relaxed);
      });
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  for (int64_t i = 0; i < items; ++i) claims[i] = counts[i].load();
}

}  // namespace strata::pool_check
