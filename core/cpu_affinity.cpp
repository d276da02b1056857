#include "core/cpu_affinity.h"

#include <omp.h>

#include <algorithm>

namespace mantissa::core {

cpu_set_t cpu_affinity_mask(pid_t pid) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(pid, sizeof mask, &mask) != 0) CPU_ZERO(&mask);
  return mask;
}

std::vector<int> cpu_list(const cpu_set_t& mask) {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> process_cpus() {
  if (omp_get_proc_bind() == omp_proc_bind_false || omp_get_num_places() == 0) {
    return cpu_list(cpu_affinity_mask(0));
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
