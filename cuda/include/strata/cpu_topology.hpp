// The host's CPU topology as Linux reports it in sysfs, and thread pinning. Host-only, no CUDA.
#pragma once

#include <vector>

namespace strata::cpu {

// One physical core: its SMT siblings (logical CPU ids, ascending) and its NUMA node (0 when unknown).
struct PhysicalCore {
  std::vector<int> cpus;
  int node = 0;
};

// The physical cores this process may run on (its affinity mask at the first call), ordered by their first
// logical CPU.
std::vector<PhysicalCore> physical_cores();

// The logical CPUs of the calling thread's affinity mask, ascending.
std::vector<int> current_thread_cpus();

// Pins the calling thread to `cpus`; throws InvalidArgument naming the CPUs if the kernel refuses.
void pin_current_thread(const std::vector<int>& cpus);

// Remembers the calling thread's affinity at construction; restore() puts it back (from any thread: the
// thread is addressed by its kernel tid). Restoring is idempotent and never throws.
class SavedAffinity {
 public:
  SavedAffinity();
  void restore() noexcept;

 private:
  int tid_;
  std::vector<int> cpus_;
  bool restored_ = false;
};

}  // namespace strata::cpu
