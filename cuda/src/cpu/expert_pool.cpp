// The layer job: gate+up row ranges of all k experts spread over every participant (the workers, and the caller
// where it joins them), then down row ranges, with no barrier between: a down item waits only for the expert
// whose h it reads, and the gate/up items are claimed expert by expert, so the first experts' down rows run while
// the last experts' h is still being made. Float matrices read x and h as float32; for quantized ones x is
// quantized once by the caller and each gate/up work item quantizes the h blocks it produced. A layer quantizes
// only what one of its matrices reads, decided once at set_layer. run_layer writes each expert's row; in the
// summed job the participant that finishes a row range's last expert adds that range up, so the sum is spread
// over the participants instead of following the job on one core.
// run_groups hands its calls to the grouped job (group_job.hpp). Both jobs find each expert through an ExpertRef
// made before the job: its rows in the registered planes or a tiered layer's arena, or the loads of a miss on its
// way from the file (expert_tier.hpp), whose items wait for it; the experts in RAM come first in the claim order.
// On a layer all in RAM each participant claims a contiguous run of the items first (item_claims.hpp), so the
// rows it reads follow one another; a tiered layer's items go from one counter, the experts in RAM first.
#include "strata/expert_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>

#include "activation.hpp"
#include "dot.hpp"
#include "expert_hidden.hpp"
#include "expert_layout.hpp"
#include "expert_tier.hpp"
#include "group_job.hpp"
#include "item_claims.hpp"
#include "pool_layer.hpp"
#include "read_bandwidth.hpp"
#include "rows_sum.hpp"
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
  RowsSum rows_sum;                     // run_rows_sum's grouping and sums over run_groups
  std::unique_ptr<DiskTier> disk;       // the tiered layers' file and staging; null until open_expert_file

  std::vector<ExpertRef> refs;      // [max_k] per active index: where its expert's weights are
  std::vector<int> order;           // [max_k] the active indices in claim order: experts in RAM first
  std::vector<int32_t> routed;      // [max_k] the active ids, as a tiered layer's policy notes them
  std::vector<ExpertMove> moves;    // the tiered layer's moves of the call in flight
  TieredLayer* tiered = nullptr;    // the call in flight's layer, when it is tiered
  std::vector<ExpertRef> group_refs;  // run_groups: per group (grows to the most groups seen)
  std::vector<int> wave_begin;        // run_groups on a tiered layer: a wave's begin, from 0
  const std::vector<ExpertRef>* fill_wave = nullptr;  // set_tiered_layer: the wave of the arena's experts in flight
  alignas(64) std::atomic<int64_t> next_fill{0};

  // The job in flight (written by the caller before WorkerTeam::run, read by the participants).
  const PoolLayer* layer = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  float* out = nullptr;
  bool summed = false;      // out is one row, the sum of the experts' rows (else one row per slot)
  std::vector<int> active;  // slots not skipped, in slot order
  int n_active = 0;
  int64_t gate_up_items = 0, down_items = 0, gate_up_per_slot = 0, down_per_slot = 0;
  // Each participant's items a contiguous run (an expert's consecutive rows), except on a tiered layer: there the
  // experts in RAM must come first in everyone's claims, while the misses' reads arrive.
  ItemClaims gate_up_claims{1}, down_claims{1};
  std::unique_ptr<std::atomic<int64_t>[]> hidden_done;  // [max_k]: gate/up items finished, per active index
  std::unique_ptr<std::atomic<int>[]> range_done;       // [down_per_slot]: experts whose rows of a range are made

  Impl(int64_t n_embd_, int64_t ff_, int max_k_)
      : n_embd(n_embd_), ff(ff_), max_k(max_k_), x_q(1, n_embd_), h_q(max_k_, ff_),
        h(static_cast<size_t>(max_k_) * ff_), rows(static_cast<size_t>(max_k_) * n_embd_), rows_sum(n_embd_),
        refs(max_k_), order(max_k_), routed(max_k_), active(max_k_),
        gate_up_per_slot((ff_ + kGateUpRows - 1) / kGateUpRows), down_per_slot((n_embd_ + kDownRows - 1) / kDownRows),
        hidden_done(std::make_unique<std::atomic<int64_t>[]>(max_k_)),
        range_done(std::make_unique<std::atomic<int>[]>(down_per_slot)) {
    x_in.q = x_q.row(0);
    for (int j = 0; j < max_k; ++j) h_in.push_back({h.data() + j * ff, h_q.row(j)});
  }

  // A miss whose read failed makes nothing: the call throws once the job is over.
  void gate_up_item(int64_t item) {
    const int64_t a = order[item / gate_up_per_slot];
    const int slot = active[a];
    const int64_t r0 = (item % gate_up_per_slot) * kGateUpRows, r1 = std::min(ff, r0 + kGateUpRows);
    const ExpertRef& ref = refs[a];
    float* hs = h.data() + slot * ff;
    if (ref.gate_up_ready()) {
      expert_hidden(layer->gate_kernel, ref.gate, layer->up_kernel, ref.up, r0, r1, x_in, hs + r0);
      if (layer->quantize_h) quantize_blocks(hs, r0 / 32, r1 / 32, h_in[slot].q);
    }
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
    const int64_t a = order[item / down_per_slot], range = item % down_per_slot;
    const int slot = active[a];
    const int64_t r0 = range * kDownRows, r1 = std::min(n_embd, r0 + kDownRows);
    await_hidden(a);
    if (!refs[a].down_ready()) return;  // the call throws; its range's sum is never made
    float* row = (summed ? rows.data() : out) + slot * n_embd;
    layer->down_kernel(refs[a].down, r0, r1, h_in[slot], weights[slot], row + r0);
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

  static void layer_job(void* context, int participant) {
    auto& p = *static_cast<Impl*>(context);
    p.gate_up_claims.each(participant, [&](int64_t i) { p.gate_up_item(i); });
    p.down_claims.each(participant, [&](int64_t i) { p.down_item(i); });
  }

  // Checks the call and sets up the job; false when no slot is left to compute.
  bool prepare(int index, const char* what, const float* x_, const int32_t* ids_, const float* weights_,
               const uint8_t* skip, int k, float* out_, bool summed_);

  // The refs and claim order of the call's active experts: a whole layer's planes, or a tiered layer's arena and
  // the reads of its misses (begun here), which its policy notes as one call.
  void place_whole(const PoolLayer& l);
  void place_tiered(const PoolLayer& l);
  // After the job: a tiered layer's reads settled (throwing a failure) and its moves into the arena made.
  void finish_call();

  void run_job(int index, const char* what, const float* x_, const int32_t* ids_, const float* weights_,
               const uint8_t* skip, int k, float* out_, bool summed_);
  void run_tiered_groups(const PoolLayer& l, const float* x, const int32_t* experts, const int* begin, int groups,
                         float* out);
  void fill(const PoolLayer& l, const std::vector<int>& hold);
  static void fill_job(void* context, int participant);

  DiskTier& disk_tier(const char* what) const {
    STRATA_EXPECTS(disk != nullptr, InvalidArgument,
                   std::string(what) + ": no expert file is open (ExpertPool::open_expert_file)");
    return *disk;
  }

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
  const int participants = impl_->team->max_participants();
  impl_->gate_up_claims = ItemClaims(participants);
  impl_->down_claims = ItemClaims(participants);
  if (options.max_rows > 0) {
    impl_->group_job = std::make_unique<GroupJob>(n_embd, expert_ff, options.max_rows, participants);
  }
}

ExpertPool::~ExpertPool() { close(); }

void ExpertPool::close() noexcept {
  if (!impl_) return;
  impl_->team.reset();
  impl_->disk.reset();  // its I/O threads first: they write into the arenas
  for (PoolLayer& l : impl_->layers) l.tier.reset();  // a closed pool holds no experts
  if (impl_->saved_affinity) impl_->saved_affinity->restore();
}

namespace {

// A layer of these matrices with its row kernels, as every job reads it; InvalidArgument naming the layer and
// matrix unless the shapes (and, with `planes`, the planes) are what the pool takes.
PoolLayer checked_layer(Isa isa, int64_t n_embd, int64_t ff, int layer, const ExpertMatrix& gate,
                        const ExpertMatrix& up, const ExpertMatrix& down, bool planes, const char* what) {
  STRATA_EXPECTS(layer >= 0 && layer < 4096, InvalidArgument,
                 std::string(what) + ": layer must be in 0..4095, found " + str(layer));
  const std::string name = "layer " + str(layer);
  auto validate = planes ? validate_matrix : validate_shape;
  validate(gate, ff, n_embd, name + " gate");
  validate(up, ff, n_embd, name + " up");
  validate(down, n_embd, ff, name + " down");
  STRATA_EXPECTS(gate.n_expert == up.n_expert && up.n_expert == down.n_expert, InvalidArgument,
                 name + ": gate/up/down hold " + str(gate.n_expert) + "/" + str(up.n_expert) + "/" +
                     str(down.n_expert) + " experts; they must agree");
  PoolLayer l;
  l.gate = gate;
  l.up = up;
  l.down = down;
  l.gate_kernel = matrix_kernel(isa, l.gate);
  l.up_kernel = matrix_kernel(isa, l.up);
  l.down_kernel = matrix_kernel(isa, l.down);
  l.quantize_x = !gate.is_float || !up.is_float;
  l.quantize_h = !down.is_float;
  l.set = true;
  return l;
}

}  // namespace

void ExpertPool::set_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down) {
  Impl& p = *impl_;
  STRATA_EXPECTS(p.team != nullptr, InvalidArgument, "set_layer: the expert pool is closed");
  PoolLayer l = checked_layer(p.isa, p.n_embd, p.ff, layer, gate, up, down, true, "set_layer");
  if (static_cast<int>(p.layers.size()) <= layer) p.layers.resize(layer + 1);
  p.layers[layer] = std::move(l);
}

void ExpertPool::open_expert_file(const std::string& path, const ExpertFileOptions& options) {
  Impl& p = *impl_;
  STRATA_EXPECTS(p.team != nullptr, InvalidArgument, "open_expert_file: the expert pool is closed");
  STRATA_EXPECTS(p.disk == nullptr, InvalidArgument,
                 "open_expert_file: " + p.disk_tier("open_expert_file").file().path() + " is open already");
  const int half = options.staging_slots == 0 ? p.max_k : options.staging_slots;
  STRATA_EXPECTS(half >= p.max_k, InvalidArgument,
                 "open_expert_file: staging_slots " + str(half) + " is below max_k " + str(p.max_k) +
                     " (a decode call's misses must fit in half the staging)");
  FileReaderOptions reader;
  reader.direct = options.direct;
  p.disk = std::make_unique<DiskTier>(std::make_unique<FileReader>(path, reader), options.io_threads, half);
}

TierSizes ExpertPool::tier_sizes(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                                 const FileMatrix& gate_file, const FileMatrix& up_file,
                                 const FileMatrix& down_file) {
  const ExpertMatrix* matrices[kMatrices] = {&gate, &up, &down};
  const FileMatrix* files[kMatrices] = {&gate_file, &up_file, &down_file};
  for (int m = 0; m < kMatrices; ++m) {
    const bool out = m == 2;  // down is n_embd x ff, gate and up ff x n_embd
    validate_shape(*matrices[m], out ? gate.cols : gate.rows, out ? gate.rows : gate.cols,
                   "tier_sizes: layer " + str(layer) + " " + kMatrixNames[m]);
  }
  return cpu::tier_sizes(layer, matrices, files);
}

void ExpertPool::set_tiered_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                                  const FileMatrix& gate_file, const FileMatrix& up_file, const FileMatrix& down_file,
                                  int slots, const std::vector<int>& hold, const TierPolicy& policy) {
  Impl& p = *impl_;
  STRATA_EXPECTS(p.team != nullptr, InvalidArgument, "set_tiered_layer: the expert pool is closed");
  DiskTier& disk = p.disk_tier("set_tiered_layer");
  PoolLayer l = checked_layer(p.isa, p.n_embd, p.ff, layer, gate, up, down, false, "set_tiered_layer");
  const std::string name = "set_tiered_layer: layer " + str(layer);
  STRATA_EXPECTS(static_cast<int>(hold.size()) <= slots, InvalidArgument,
                 name + ": " + str(hold.size()) + " experts to hold in " + str(slots) + " slots");
  std::vector<bool> seen(gate.n_expert, false);
  for (const int e : hold) {
    STRATA_EXPECTS(e >= 0 && e < gate.n_expert && !seen[e], InvalidArgument,
                   name + ": expert " + str(e) + " to hold is outside 0.." + str(gate.n_expert - 1) +
                       " or given twice");
    seen[e] = true;
  }
  const auto matrices = l.matrices();
  const FileMatrix* files[kMatrices] = {&gate_file, &up_file, &down_file};
  l.tier = std::make_unique<TieredLayer>(layer, matrices.data(), files, slots, policy);
  disk.reserve(*l.tier);
  p.fill(l, hold);
  l.tier->policy.hold(0, hold);
  if (static_cast<int>(p.layers.size()) <= layer) p.layers.resize(layer + 1);
  p.layers[layer] = std::move(l);
}

// The arena's first experts, read in waves of half the staging: the next wave's reads in flight while the
// participants repack one (each load awaited by the participant that claims it).
void ExpertPool::Impl::fill(const PoolLayer& l, const std::vector<int>& hold) {
  TieredLayer& t = *l.tier;
  const auto matrices = l.matrices();
  std::vector<ExpertRef> wave[2];
  size_t next = 0;
  auto issue = [&](int half) {
    wave[half].clear();
    for (; next < hold.size() && static_cast<int>(wave[half].size()) < disk->half_slots(); ++next) {
      wave[half].push_back(disk->load(t, hold[next], matrices.data(), half, t.slot(static_cast<int>(next))));
      t.bytes_read += t.file_bytes();
    }
  };
  try {
    issue(0);
    issue(1);
    for (int half = 0; !wave[half].empty(); half ^= 1) {
      fill_wave = &wave[half];
      next_fill.store(0, std::memory_order_relaxed);
      team->run(&Impl::fill_job, this);
      disk->settle(half);
      issue(half);
    }
  } catch (...) {
    disk->drain(0);
    disk->drain(1);
    throw;
  }
}

void ExpertPool::Impl::fill_job(void* context, int /*participant*/) {
  auto& p = *static_cast<Impl*>(context);
  const std::vector<ExpertRef>& wave = *p.fill_wave;
  const int64_t loads = static_cast<int64_t>(wave.size()) * kMatrices;
  for (int64_t i; (i = p.next_fill.fetch_add(1, std::memory_order_relaxed)) < loads;) {
    const ExpertRef& r = wave[i / kMatrices];
    MatrixLoad* load[kMatrices] = {r.gate_load, r.up_load, r.down_load};
    load[i % kMatrices]->await();
  }
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
  ids = ids_;
  n_active = count;
  if (l.tier) {
    place_tiered(l);
  } else {
    place_whole(l);
  }
  if (l.quantize_x) quantize_blocks(x_, 0, n_embd / 32, x_in.q);
  x_in.f32 = x_;
  layer = &l;
  weights = weights_;
  out = out_;
  summed = summed_;
  gate_up_items = count * gate_up_per_slot;
  down_items = count * down_per_slot;
  for (int a = 0; a < count; ++a) hidden_done[a].store(0, std::memory_order_relaxed);
  for (int64_t r = 0; r < down_per_slot; ++r) range_done[r].store(0, std::memory_order_relaxed);
  const int parts = l.tier ? 1 : team->participants();
  gate_up_claims.reset(gate_up_items, parts);
  down_claims.reset(down_items, parts);
  return true;
}

void ExpertPool::Impl::place_whole(const PoolLayer& l) {
  tiered = nullptr;
  for (int a = 0; a < n_active; ++a) {
    const int64_t e = ids[active[a]];
    refs[a] = {expert_rows(l.gate, e), expert_rows(l.up, e), expert_rows(l.down, e)};
    order[a] = a;
  }
}

void ExpertPool::Impl::place_tiered(const PoolLayer& l) {
  TieredLayer& t = *l.tier;
  disk->check_usable();
  for (int a = 0; a < n_active; ++a) routed[a] = ids[active[a]];
  t.policy.note(0, routed.data(), n_active);
  moves = t.policy.plan();  // its admitted experts are read straight into their arena slots
  const auto matrices = l.matrices();
  int placed = 0;
  for (int a = 0; a < n_active; ++a) {  // hits first: they compute while the misses arrive
    const int s = t.policy.slot_of(0, routed[a]);
    if (s < 0) continue;
    refs[a] = t.in_arena(s, matrices.data());
    order[placed++] = a;
    ++t.hits;
  }
  tiered = &t;
  try {
    for (int a = 0; a < n_active; ++a) {
      if (t.policy.slot_of(0, routed[a]) >= 0) continue;
      order[placed++] = a;
      const int same = static_cast<int>(std::find(routed.begin(), routed.begin() + a, routed[a]) - routed.begin());
      if (same < a) {  // routed twice in one call: read once
        refs[a] = refs[same];
        continue;
      }
      std::uint8_t* dst = nullptr;
      for (const ExpertMove& m : moves) {
        if (m.expert == routed[a]) dst = t.slot(m.slot);
      }
      refs[a] = disk->load(t, routed[a], matrices.data(), 0, dst);
      ++t.misses;
      t.bytes_read += t.file_bytes();
    }
  } catch (...) {
    disk->drain(0);
    throw;
  }
}

void ExpertPool::Impl::finish_call() {
  if (tiered == nullptr) return;
  TieredLayer& t = *tiered;
  tiered = nullptr;
  disk->settle(0);
  for (const ExpertMove& m : moves) {
    t.policy.complete(m);
    ++t.moves;
  }
}

void ExpertPool::run_layer(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                           int k, float* out) {
  Impl& p = *impl_;
  if (!p.prepare(layer, "run_layer", x, ids, weights, skip, k, out, false)) return;
  p.team->run(&Impl::layer_job, &p);
  p.finish_call();
}

void ExpertPool::run_layer_sum(int layer, const float* x, const int32_t* ids, const float* weights,
                               const uint8_t* skip, int k, float* out) {
  Impl& p = *impl_;
  if (!p.prepare(layer, "run_layer_sum", x, ids, weights, skip, k, out, true)) {
    std::fill(out, out + p.n_embd, 0.0f);
    return;
  }
  p.team->run(&Impl::layer_job, &p);
  p.finish_call();
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
  if (static_cast<int>(p.group_refs.size()) < groups) p.group_refs.resize(groups);
  if (l.tier) {
    p.run_tiered_groups(l, x, experts, begin, groups, out);
    return;
  }
  for (int g = 0; g < groups; ++g) {
    p.group_refs[g] = {expert_rows(l.gate, experts[g]), expert_rows(l.up, experts[g]), expert_rows(l.down, experts[g])};
  }
  p.group_job->run(*p.team, l, x, p.group_refs.data(), begin, groups, out, true);
}

void ExpertPool::run_rows_sum(int layer, const float* x, const int32_t* ids, const float* weights,
                               const uint8_t* skip, int rows, int k, float* out) {
  impl_->rows_sum.run(*this, layer, x, ids, weights, skip, rows, k, out);
}

// Waves of consecutive groups with at most half the staging's misses each, in alternate halves: the next wave's
// reads in flight while one computes. The groups' experts are found in the arena or read once per wave (a
// prompt chunk's groups are by expert: an expert is in one group); the arena does not move.
void ExpertPool::Impl::run_tiered_groups(const PoolLayer& l, const float* x, const int32_t* experts, const int* begin,
                                         int groups, float* out) {
  TieredLayer& t = *l.tier;
  disk->check_usable();
  const auto matrices = l.matrices();
  int next = 0;
  auto issue = [&](int half) {
    const int g0 = next;
    for (int misses = 0; next < groups; ++next) {
      ExpertRef& ref = group_refs[next];
      const int e = experts[next];
      if (begin[next + 1] == begin[next]) {  // an empty group reads nothing
        ref = ExpertRef{};
        continue;
      }
      if (const int s = t.policy.slot_of(0, e); s >= 0) {
        ref = t.in_arena(s, matrices.data());
        ++t.hits;
        continue;
      }
      int same = g0;
      while (same < next && !(experts[same] == e && group_refs[same].gate_load != nullptr)) ++same;
      if (same < next) {
        ref = group_refs[same];
        continue;
      }
      if (misses == disk->half_slots()) break;
      ref = disk->load(t, e, matrices.data(), half, nullptr);
      ++misses;
      ++t.misses;
      t.bytes_read += t.file_bytes();
    }
    return std::pair<int, int>(g0, next);
  };
  try {
    std::pair<int, int> wave[2];
    wave[0] = issue(0);
    wave[1] = issue(1);
    for (int half = 0; wave[half].first < wave[half].second; half ^= 1) {
      const auto [g0, g1] = wave[half];
      if (static_cast<int>(wave_begin.size()) <= g1 - g0) wave_begin.resize(g1 - g0 + 1);
      for (int g = g0; g <= g1; ++g) wave_begin[g - g0] = begin[g] - begin[g0];
      group_job->run(*team, l, x + begin[g0] * n_embd, group_refs.data() + g0, wave_begin.data(), g1 - g0,
                     out + begin[g0] * n_embd, false);
      disk->settle(half);
      wave[half] = issue(half);
    }
  } catch (...) {
    disk->drain(0);
    disk->drain(1);
    throw;
  }
}

bool ExpertPool::is_tiered(int layer) const { return has_layer(layer) && impl_->layers[layer].tier != nullptr; }

std::vector<TierLayerStats> ExpertPool::tier_stats() const {
  std::vector<TierLayerStats> out;
  for (const PoolLayer& l : impl_->layers) {
    if (!l.tier) continue;
    const TieredLayer& t = *l.tier;
    TierLayerStats s;
    s.layer = t.layer;
    s.slots = t.slots;
    s.hits = t.hits;
    s.misses = t.misses;
    s.moves = t.moves;
    s.bytes_read = t.bytes_read;
    for (int slot = 0; slot < t.slots; ++slot) s.experts.push_back(t.policy.expert_in(0, slot));
    out.push_back(std::move(s));
  }
  return out;
}

ExpertFileInfo ExpertPool::expert_file_info() const {
  const DiskTier& d = impl_->disk_tier("expert_file_info");
  ExpertFileInfo info;
  info.path = d.file().path();
  info.direct = d.file().direct();
  info.buffered_reason = d.file().buffered_reason();
  info.io_threads = d.io_threads();
  info.staging_slots = d.half_slots();
  info.staging_bytes = d.staging_bytes();
  info.staging_locked = d.staging_locked();
  info.bytes_read = d.file().bytes_read();
  for (const PoolLayer& l : impl_->layers) {
    if (!l.tier) continue;
    info.arena_bytes += static_cast<int64_t>(l.tier->arena.bytes());
    info.arenas_locked = info.arenas_locked && (l.tier->arena.bytes() == 0 || l.tier->arena.locked());
  }
  return info;
}

int64_t ExpertPool::expert_bytes(int layer) const {
  const PoolLayer& l = impl_->registered(layer, "expert_bytes");
  int64_t total = 0;
  for (const ExpertMatrix* m : l.matrices()) total += static_cast<int64_t>(expert_plane_bytes(*m).total());
  return total;
}

void ExpertPool::read_expert(int layer, int expert, uint8_t* out) {
  Impl& p = *impl_;
  const PoolLayer& l = p.registered(layer, "read_expert");
  STRATA_EXPECTS(expert >= 0 && expert < l.gate.n_expert, InvalidArgument,
                 "read_expert: layer " + str(layer) + " expert " + str(expert) + " is outside 0.." +
                     str(l.gate.n_expert - 1));
  const auto matrices = l.matrices();
  ExpertRef ref;
  if (!l.tier) {
    ref = {expert_rows(l.gate, expert), expert_rows(l.up, expert), expert_rows(l.down, expert)};
  } else if (const int s = l.tier->policy.slot_of(0, expert); s >= 0) {
    ref = l.tier->in_arena(s, matrices.data());
  } else {
    p.disk->check_usable();
    try {
      ref = p.disk->load(*l.tier, expert, matrices.data(), 0, nullptr);
      ref.gate_up_ready();  // repacked here: no job runs
      ref.down_ready();
    } catch (...) {
      p.disk->drain(0);
      throw;
    }
    p.disk->settle(0);
  }
  const MatrixRows* rows[kMatrices] = {&ref.gate, &ref.up, &ref.down};
  for (int m = 0; m < kMatrices; ++m) {
    const PlaneBytes b = expert_plane_bytes(*matrices[m]);
    const MatrixRows& r = *rows[m];
    const void* planes[] = {r.codes, r.d, r.sub_scales, r.mins, r.sub_mins};
    const std::size_t bytes[] = {b.codes, b.d, b.sub_scales, b.mins, b.sub_mins};
    for (int i = 0; i < 5; ++i) {
      if (bytes[i] == 0) continue;
      std::memcpy(out, planes[i], bytes[i]);
      out += bytes[i];
    }
  }
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
  STRATA_EXPECTS(!l.tier, InvalidArgument,
                 "layer_matrices: layer " + str(layer) + " is tiered (" + str(l.tier->slots) + " of its " +
                     str(l.gate.n_expert) + " experts in RAM, the rest in " + impl_->disk->file().path() +
                     "): the VRAM expert cache and the prompt staging copy from whole layers only");
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
