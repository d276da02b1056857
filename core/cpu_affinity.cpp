#include "core/cpu_affinity.h"

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

}  // namespace mantissa::core
