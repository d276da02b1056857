// The CPUs a process may run on (sched_getaffinity), as a mask and as a list. A mask that
// cannot be read (no such process; a machine of more than CPU_SETSIZE = 1024 CPUs, whose kernel
// mask does not fit one) is empty.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <vector>

namespace mantissa::core {

// `pid` 0: this thread.
cpu_set_t cpu_affinity_mask(pid_t pid);

// The CPUs in `mask`, in increasing order.
std::vector<int> cpu_list(const cpu_set_t& mask);

// The CPUs this process may run its threads on, in increasing order: its affinity, or, where
// OpenMP binds threads to places (OMP_PLACES, OMP_PROC_BIND), the CPUs of all its places, since
// OpenMP has bound this thread to the first place as the process started.
std::vector<int> process_cpus();

}  // namespace mantissa::core
