// The CPUs a process may run on (sched_getaffinity), read with a mask as large as the
// kernel's, so that machines of more than CPU_SETSIZE (1024) CPUs are read whole.
#pragma once

#include <sys/types.h>

#include <vector>

namespace mantissa::core {

// The CPUs process `pid` (0: this thread) may run on, in increasing order; empty when they
// cannot be read (no such process).
std::vector<int> affinity_cpus(pid_t pid);

// The CPUs this process may run its threads on, in increasing order: its affinity, or, where
// OpenMP binds threads to places (OMP_PLACES, OMP_PROC_BIND), the CPUs of all its places, since
// OpenMP has bound this thread to the first place as the process started.
std::vector<int> process_cpus();

}  // namespace mantissa::core
