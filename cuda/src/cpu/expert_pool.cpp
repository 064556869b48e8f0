// The layer job: gate+up row ranges of all k experts spread over every participant (the workers, and the caller
// where it joins them), then down row ranges, with no barrier between: a down item waits only for the expert
// whose h it reads, and the gate/up items are claimed expert by expert, so the first experts' down rows run while
// the last experts' h is still being made. Float matrices read x and h as float32; for quantized ones x is
// quantized once by the caller and each gate/up work item quantizes the h blocks it produced. A layer quantizes
// only what one of its matrices reads, decided once at set_layer. run_layer writes each expert's row; in the
// summed job the participant that finishes a row range's last expert adds that range up, so the sum is spread
// over the participants instead of following the job on one core.
// run_groups hands its calls to the grouped job (group_job.hpp).
#include "strata/expert_pool.hpp"

#include <algorithm>
#include <atomic>
#include <memory>

#include "activation.hpp"
#include "dot.hpp"
#include "expert_hidden.hpp"
#include "expert_layout.hpp"
#include "group_job.hpp"
#include "pool_layer.hpp"
#include "read_bandwidth.hpp"
#include "strata/cpu_topology.hpp"
#include "strata/error.hpp"
#include "worker_team.hpp"

namespace strata::cpu {
namespace {

// Rows per work item. Gate/up items are whole q8_32 blocks of h, so the item can quantize what it made.
constexpr int64_t kGateUpRows = 32;
constexpr int64_t kDownRows = 64;
// The most rows run_groups may be sized for (PoolOptions::max_rows): its scratch is about
// 1.75 * (n_embd + ff) + 4 * ff bytes a row.
constexpr int kMaxGroupRows = 1 << 20;

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

struct ExpertPool::Impl {
  int64_t n_embd, ff;
  int max_k;
  Isa isa;
  std::vector<std::vector<int>> worker_cpus;
  std::vector<int> caller_cpus;
  std::unique_ptr<SavedAffinity> saved_affinity;
  std::unique_ptr<WorkerTeam> team;
  std::vector<PoolLayer> layers;

  QuantizedRows x_q;             // [1]
  QuantizedRows h_q;             // one row per slot
  std::vector<float> h;          // [max_k][ff]
  std::vector<float> rows;       // [max_k][n_embd]: the summed job's weighted rows
  Activation x_in;               // the job's x (float32 from the caller) and x_q
  std::vector<Activation> h_in;  // one per slot: its row of h and h_q
  std::unique_ptr<GroupJob> group_job;  // run_groups' scratch and job; null when max_rows is 0

  // The job in flight (written by the caller before WorkerTeam::run, read by the participants).
  const PoolLayer* layer = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  float* out = nullptr;
  bool summed = false;      // out is one row, the sum of the experts' rows (else one row per slot)
  std::vector<int> active;  // slots not skipped, in slot order
  int n_active = 0;
  int64_t gate_up_items = 0, down_items = 0, gate_up_per_slot = 0, down_per_slot = 0;
  alignas(64) std::atomic<int64_t> next_gate_up{0};
  alignas(64) std::atomic<int64_t> next_down{0};
  std::unique_ptr<std::atomic<int64_t>[]> hidden_done;  // [max_k]: gate/up items finished, per active index
  std::unique_ptr<std::atomic<int>[]> range_done;       // [down_per_slot]: experts whose rows of a range are made

  Impl(int64_t n_embd_, int64_t ff_, int max_k_)
      : n_embd(n_embd_), ff(ff_), max_k(max_k_), x_q(1, n_embd_), h_q(max_k_, ff_),
        h(static_cast<size_t>(max_k_) * ff_), rows(static_cast<size_t>(max_k_) * n_embd_), active(max_k_),
        gate_up_per_slot((ff_ + kGateUpRows - 1) / kGateUpRows), down_per_slot((n_embd_ + kDownRows - 1) / kDownRows),
        hidden_done(std::make_unique<std::atomic<int64_t>[]>(max_k_)),
        range_done(std::make_unique<std::atomic<int>[]>(down_per_slot)) {
    x_in.q = x_q.row(0);
    for (int j = 0; j < max_k; ++j) h_in.push_back({h.data() + j * ff, h_q.row(j)});
  }

  void gate_up_item(int64_t item) {
    const int64_t a = item / gate_up_per_slot;
    const int slot = active[a];
    const int64_t r0 = (item % gate_up_per_slot) * kGateUpRows, r1 = std::min(ff, r0 + kGateUpRows);
    const int64_t e = ids[slot];
    float* hs = h.data() + slot * ff;
    expert_hidden(layer->gate_kernel, expert_rows(layer->gate, e), layer->up_kernel, expert_rows(layer->up, e), r0,
                  r1, x_in, hs + r0);
    if (layer->quantize_h) quantize_blocks(hs, r0 / 32, r1 / 32, h_in[slot].q);
    hidden_done[a].fetch_add(1, std::memory_order_release);
  }

  // Returns once active expert a's h (and its q8_32) is complete. Every gate/up item is claimed before any
  // down item, by a participant that finishes it without waiting on anything: the wait always ends.
  void await_hidden(int64_t a) const {
    while (hidden_done[a].load(std::memory_order_acquire) < gate_up_per_slot) spin_pause();
  }

  // Rows [r0, r1) of one expert's weighted row: into the caller's out (run_layer) or the summed job's rows, where
  // the participant that makes a range's last expert adds the range up.
  void down_item(int64_t item) {
    const int64_t a = item / down_per_slot, range = item % down_per_slot;
    const int slot = active[a];
    const int64_t r0 = range * kDownRows, r1 = std::min(n_embd, r0 + kDownRows);
    await_hidden(a);
    float* row = (summed ? rows.data() : out) + slot * n_embd;
    layer->down_kernel(expert_rows(layer->down, ids[slot]), r0, r1, h_in[slot], weights[slot], row + r0);
    if (summed && range_done[range].fetch_add(1, std::memory_order_acq_rel) + 1 == n_active) sum_range(r0, r1);
  }

  // out[r0, r1) = the experts' rows there, added in slot order from zero: the same sums, bit for bit, as adding
  // run_layer's rows one after another.
  void sum_range(int64_t r0, int64_t r1) const {
    std::fill(out + r0, out + r1, 0.0f);
    for (int64_t a = 0; a < n_active; ++a) {
      const float* row = rows.data() + active[a] * n_embd;
      for (int64_t r = r0; r < r1; ++r) out[r] += row[r];
    }
  }

  static void layer_job(void* context, int /*participant*/) {
    auto& p = *static_cast<Impl*>(context);
    for (int64_t i; (i = p.next_gate_up.fetch_add(1, std::memory_order_relaxed)) < p.gate_up_items;) p.gate_up_item(i);
    for (int64_t i; (i = p.next_down.fetch_add(1, std::memory_order_relaxed)) < p.down_items;) p.down_item(i);
  }

  // Checks the call and sets up the job; false when no slot is left to compute.
  bool prepare(int index, const char* what, const float* x_, const int32_t* ids_, const float* weights_,
               const uint8_t* skip, int k, float* out_, bool summed_);

  const PoolLayer& registered(int index, const char* what) const {
    STRATA_EXPECTS(team != nullptr, InvalidArgument, std::string(what) + ": the expert pool is closed");
    STRATA_EXPECTS(index >= 0 && index < static_cast<int>(layers.size()) && layers[index].set, InvalidArgument,
                   std::string(what) + ": layer " + str(index) + " has no experts registered");
    return layers[index];
  }
};

ExpertPool::ExpertPool(int64_t n_embd, int64_t expert_ff, int max_k, const PoolOptions& options) {
  STRATA_EXPECTS(n_embd >= 32 && n_embd % 32 == 0 && n_embd <= kMaxCols, InvalidArgument,
                 "expert pool: n_embd must be a multiple of 32 in 32.." + str(kMaxCols) + ", found " + str(n_embd));
  STRATA_EXPECTS(expert_ff >= 32 && expert_ff % 32 == 0 && expert_ff <= kMaxCols, InvalidArgument,
                 "expert pool: expert_ff must be a multiple of 32 in 32.." + str(kMaxCols) + ", found " +
                     str(expert_ff));
  STRATA_EXPECTS(max_k >= 1 && max_k <= 1024, InvalidArgument,
                 "expert pool: max_k must be in 1..1024, found " + str(max_k));
  STRATA_EXPECTS(options.threads >= 0, InvalidArgument,
                 "expert pool: threads must be >= 0 (0 = automatic), found " + str(options.threads));
  STRATA_EXPECTS(options.max_rows >= 0 && options.max_rows <= kMaxGroupRows, InvalidArgument,
                 "expert pool: max_rows must be in 0.." + str(kMaxGroupRows) + ", found " + str(options.max_rows));
  impl_ = std::make_unique<Impl>(n_embd, expert_ff, max_k);
  if (options.max_rows > 0) impl_->group_job = std::make_unique<GroupJob>(n_embd, expert_ff, options.max_rows);
  impl_->isa = resolve_isa(options.isa);

  // The first physical core (all its siblings) belongs to the host loop; one worker per other core.
  const std::vector<PhysicalCore> cores = physical_cores();
  const size_t first_worker_core = cores.size() >= 2 ? 1 : 0;
  std::vector<std::vector<int>> candidates;
  for (size_t c = first_worker_core; c < cores.size(); ++c) {
    if (options.smt) {
      for (int cpu : cores[c].cpus) candidates.push_back({cpu});
    } else {
      candidates.push_back({cores[c].cpus.front()});
    }
  }
  if (candidates.empty()) candidates.push_back({});  // no topology: one unpinned worker
  const size_t n = options.threads == 0 ? candidates.size() : static_cast<size_t>(options.threads);
  STRATA_EXPECTS(n <= candidates.size(), InvalidArgument,
                 "expert pool: threads=" + str(options.threads) + " exceeds the " + str(candidates.size()) +
                     " worker CPUs available (one per physical core but the first" +
                     (options.smt ? ", every SMT sibling" : "") + ")");
  impl_->worker_cpus.assign(candidates.begin(), candidates.begin() + n);
  if (options.pin_caller && first_worker_core == 1) {
    impl_->saved_affinity = std::make_unique<SavedAffinity>();
    pin_current_thread(cores[0].cpus);
  }
  impl_->caller_cpus = current_thread_cpus();
  impl_->team = std::make_unique<WorkerTeam>(impl_->worker_cpus, options.spin_us);
}

ExpertPool::~ExpertPool() { close(); }

void ExpertPool::close() noexcept {
  if (!impl_) return;
  impl_->team.reset();
  if (impl_->saved_affinity) impl_->saved_affinity->restore();
}

void ExpertPool::set_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down) {
  Impl& p = *impl_;
  STRATA_EXPECTS(p.team != nullptr, InvalidArgument, "set_layer: the expert pool is closed");
  STRATA_EXPECTS(layer >= 0 && layer < 4096, InvalidArgument, "set_layer: layer must be in 0..4095, found " + str(layer));
  const std::string name = "layer " + str(layer);
  validate_matrix(gate, p.ff, p.n_embd, name + " gate");
  validate_matrix(up, p.ff, p.n_embd, name + " up");
  validate_matrix(down, p.n_embd, p.ff, name + " down");
  STRATA_EXPECTS(gate.n_expert == up.n_expert && up.n_expert == down.n_expert, InvalidArgument,
                 name + ": gate/up/down hold " + str(gate.n_expert) + "/" + str(up.n_expert) + "/" +
                     str(down.n_expert) + " experts; they must agree");
  if (static_cast<int>(p.layers.size()) <= layer) p.layers.resize(layer + 1);
  PoolLayer& l = p.layers[layer];
  l.gate = gate;
  l.up = up;
  l.down = down;
  l.gate_kernel = matrix_kernel(p.isa, l.gate);
  l.up_kernel = matrix_kernel(p.isa, l.up);
  l.down_kernel = matrix_kernel(p.isa, l.down);
  l.quantize_x = !gate.is_float || !up.is_float;
  l.quantize_h = !down.is_float;
  l.set = true;
}

bool ExpertPool::Impl::prepare(int index, const char* what, const float* x_, const int32_t* ids_,
                               const float* weights_, const uint8_t* skip, int k, float* out_, bool summed_) {
  const PoolLayer& l = registered(index, what);
  STRATA_EXPECTS(k >= 0 && k <= max_k, InvalidArgument,
                 std::string(what) + ": k must be in 0.." + str(max_k) + " (max_k), found " + str(k));
  int count = 0;
  for (int j = 0; j < k; ++j) {
    if (skip != nullptr && skip[j] != 0) continue;
    STRATA_EXPECTS(ids_[j] >= 0 && ids_[j] < l.gate.n_expert, InvalidArgument,
                   std::string(what) + ": layer " + str(index) + " ids[" + str(j) + "] = " + str(ids_[j]) +
                       " is outside 0.." + str(l.gate.n_expert - 1));
    active[count++] = j;
  }
  if (count == 0) return false;
  if (l.quantize_x) quantize_blocks(x_, 0, n_embd / 32, x_in.q);
  x_in.f32 = x_;
  layer = &l;
  ids = ids_;
  weights = weights_;
  out = out_;
  summed = summed_;
  n_active = count;
  gate_up_items = count * gate_up_per_slot;
  down_items = count * down_per_slot;
  for (int a = 0; a < count; ++a) hidden_done[a].store(0, std::memory_order_relaxed);
  for (int64_t r = 0; r < down_per_slot; ++r) range_done[r].store(0, std::memory_order_relaxed);
  next_gate_up.store(0, std::memory_order_relaxed);
  next_down.store(0, std::memory_order_relaxed);
  return true;
}

void ExpertPool::run_layer(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                           int k, float* out) {
  Impl& p = *impl_;
  if (p.prepare(layer, "run_layer", x, ids, weights, skip, k, out, false)) p.team->run(&Impl::layer_job, &p);
}

void ExpertPool::run_layer_sum(int layer, const float* x, const int32_t* ids, const float* weights,
                               const uint8_t* skip, int k, float* out) {
  Impl& p = *impl_;
  if (p.prepare(layer, "run_layer_sum", x, ids, weights, skip, k, out, true)) p.team->run(&Impl::layer_job, &p);
  else std::fill(out, out + p.n_embd, 0.0f);
}

void ExpertPool::run_groups(int layer, const float* x, const int32_t* experts, const int* begin, int groups,
                            float* out) {
  Impl& p = *impl_;
  const PoolLayer& l = p.registered(layer, "run_groups");
  const std::string where = "run_groups: layer " + str(layer) + " ";
  STRATA_EXPECTS(groups >= 0, InvalidArgument, where + "groups must be >= 0, found " + str(groups));
  if (groups == 0) return;
  STRATA_EXPECTS(begin[0] == 0, InvalidArgument, where + "begin[0] must be 0, found " + str(begin[0]));
  for (int g = 0; g < groups; ++g) {
    STRATA_EXPECTS(experts[g] >= 0 && experts[g] < l.gate.n_expert, InvalidArgument,
                   where + "experts[" + str(g) + "] = " + str(experts[g]) + " is outside 0.." +
                       str(l.gate.n_expert - 1));
    STRATA_EXPECTS(begin[g + 1] >= begin[g], InvalidArgument,
                   where + "begin[" + str(g + 1) + "] = " + str(begin[g + 1]) + " is below begin[" + str(g) +
                       "] = " + str(begin[g]) + " (groups hold consecutive rows)");
  }
  const int max_rows = p.group_job ? p.group_job->max_rows() : 0;
  STRATA_EXPECTS(begin[groups] <= max_rows, InvalidArgument,
                 where + "groups hold " + str(begin[groups]) + " rows, more than the pool's max_rows " +
                     str(max_rows) + " (PoolOptions::max_rows)");
  if (begin[groups] == 0) return;
  p.group_job->run(*p.team, l, x, experts, begin, groups, out);
}

double ExpertPool::read_bandwidth(int64_t bytes, int reps) {
  STRATA_EXPECTS(impl_->team != nullptr, InvalidArgument, "read_bandwidth: the expert pool is closed");
  return measure_read_bandwidth(*impl_->team, impl_->isa, bytes, reps);
}

int ExpertPool::layers() const { return static_cast<int>(impl_->layers.size()); }

bool ExpertPool::has_layer(int layer) const {
  return layer >= 0 && layer < layers() && impl_->layers[layer].set;
}

LayerMatrices ExpertPool::layer_matrices(int layer) const {
  const PoolLayer& l = impl_->registered(layer, "layer_matrices");
  return {l.gate, l.up, l.down};
}

int ExpertPool::max_rows() const { return impl_->group_job ? impl_->group_job->max_rows() : 0; }

int ExpertPool::threads() const { return static_cast<int>(impl_->worker_cpus.size()); }
int ExpertPool::participants() const { return impl_->team ? impl_->team->participants() : 0; }
Isa ExpertPool::isa() const { return impl_->isa; }
std::vector<std::vector<int>> ExpertPool::worker_cpus() const { return impl_->worker_cpus; }
std::vector<int> ExpertPool::caller_cpus() const { return impl_->caller_cpus; }
int ExpertPool::parked_workers() const { return impl_->team ? impl_->team->parked() : 0; }

}  // namespace strata::cpu
