// Topology from sysfs: /sys/devices/system/cpu/cpuN/topology/thread_siblings_list groups logical CPUs into
// physical cores, /sys/devices/system/node/nodeK/cpulist gives NUMA nodes. Only CPUs in the process's
// affinity mask count, so a container or taskset limit is respected.
#include "strata/cpu_topology.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "strata/error.hpp"

namespace strata::cpu {
namespace {

// Parses a sysfs CPU list such as "0-3,8,10-11".
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part == "\n") continue;
    const auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

bool read_line(const std::string& path, std::string& line) {
  std::ifstream in(path);
  return static_cast<bool>(std::getline(in, line));
}

std::vector<int> mask_cpus(const cpu_set_t& set) {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

cpu_set_t make_mask(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return set;
}

std::map<int, int> numa_node_of_cpu() {
  std::map<int, int> node_of;
  std::string line;
  for (int node = 0; node < 1024; ++node) {
    if (!read_line("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist", line)) {
      if (node > 0 && node_of.empty()) break;
      continue;
    }
    for (int c : parse_cpu_list(line)) node_of[c] = node;
  }
  return node_of;
}

int current_tid() { return static_cast<int>(syscall(SYS_gettid)); }

}  // namespace

std::vector<int> current_thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  return mask_cpus(set);
}

namespace {

std::vector<PhysicalCore> read_physical_cores() {
  cpu_set_t process_set;
  CPU_ZERO(&process_set);
  // The process's mask is the main thread's (tid == pid); a pinned caller thread must not shrink the topology.
  if (sched_getaffinity(getpid(), sizeof(process_set), &process_set) != 0) return {};
  const std::vector<int> allowed = mask_cpus(process_set);
  const std::map<int, int> node_of = numa_node_of_cpu();

  std::map<int, PhysicalCore> by_first_sibling;
  std::string line;
  for (int cpu : allowed) {
    std::vector<int> siblings{cpu};
    if (read_line("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list", line))
      siblings = parse_cpu_list(line);
    // Keep only siblings the process may use; the core is keyed by its first usable sibling.
    std::vector<int> usable;
    for (int s : siblings)
      if (std::binary_search(allowed.begin(), allowed.end(), s)) usable.push_back(s);
    if (usable.empty()) usable.push_back(cpu);
    std::sort(usable.begin(), usable.end());
    PhysicalCore& core = by_first_sibling[usable.front()];
    core.cpus = usable;
    const auto node = node_of.find(usable.front());
    core.node = node == node_of.end() ? 0 : node->second;
  }
  std::vector<PhysicalCore> cores;
  for (auto& [first, core] : by_first_sibling) cores.push_back(std::move(core));
  return cores;
}

}  // namespace

std::vector<PhysicalCore> physical_cores() {
  // Read once per process: a pool pins its caller (often the main thread, whose mask is the process's),
  // which must not shrink the topology a later pool or query sees.
  static const std::vector<PhysicalCore> cores = read_physical_cores();
  return cores;
}

void pin_current_thread(const std::vector<int>& cpus) {
  const cpu_set_t set = make_mask(cpus);
  std::string names;
  for (int c : cpus) names += (names.empty() ? "" : ",") + std::to_string(c);
  STRATA_EXPECTS(!cpus.empty() && sched_setaffinity(0, sizeof(set), &set) == 0, InvalidArgument,
                 "cannot pin thread to CPUs {" + names + "}: the kernel refused the affinity mask");
}

SavedAffinity::SavedAffinity() : tid_(current_tid()), cpus_(current_thread_cpus()) {}

void SavedAffinity::restore() noexcept {
  if (restored_ || cpus_.empty()) return;
  const cpu_set_t set = make_mask(cpus_);
  (void)sched_setaffinity(tid_, sizeof(set), &set);  // the thread may have exited: nothing left to restore
  restored_ = true;
}

}  // namespace strata::cpu
