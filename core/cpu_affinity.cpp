#include "core/cpu_affinity.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <memory>

namespace mantissa::core {

std::vector<int> affinity_cpus(pid_t pid) {
  // The kernel refuses (EINVAL) a mask smaller than its own CPU count: double until it fits.
  for (int cpus = CPU_SETSIZE; cpus <= (1 << 22); cpus *= 2) {
    const std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> mask(CPU_ALLOC(cpus),
                                                                [](cpu_set_t* m) { CPU_FREE(m); });
    if (!mask) return {};
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, mask.get());
    if (sched_getaffinity(pid, bytes, mask.get()) != 0) {
      if (errno == EINVAL) continue;
      return {};
    }
    std::vector<int> list;
    for (int cpu = 0; cpu < cpus; ++cpu) {
      if (CPU_ISSET_S(cpu, bytes, mask.get())) list.push_back(cpu);
    }
    return list;
  }
  return {};
}

std::vector<int> process_cpus() {
  if (omp_get_proc_bind() == omp_proc_bind_false || omp_get_num_places() == 0) {
    return affinity_cpus(0);
  }
  std::vector<int> cpus;
  for (int place = 0; place < omp_get_num_places(); ++place) {
    std::vector<int> ids(static_cast<size_t>(omp_get_place_num_procs(place)));
    omp_get_place_proc_ids(place, ids.data());
    cpus.insert(cpus.end(), ids.begin(), ids.end());
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace mantissa::core
