// How many OpenMP threads each rank runs. OpenMP's default is every CPU the process may run
// on, in every process: ranks free to run on the same CPUs (`mpirun --bind-to none`, or more
// ranks than cores, where Open MPI binds none) each start that many threads. Oversubscribed
// threads take turns, and every parallel region waits for the ones descheduled: 4 ranks on 2
// cores trained 3.7x slower with that default (2 threads each) than with 1 thread each. So
// ranks on one host that may run on the same CPUs divide them, unless OMP_NUM_THREADS says
// otherwise; a host that it oversubscribes gets a warning.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mantissa::dist {
class World;
}

namespace mantissa::launcher {

// Where a rank may run: its host and its CPUs (dist::World gathers both for every rank).
struct RankCpus {
  std::string host;
  std::vector<int> cpus;  // increasing; empty where unknown
};

// The ranks on `rank`'s host whose CPUs overlap its own, itself included, in rank order.
std::vector<int> ranks_sharing_cpus(const std::vector<RankCpus>& ranks, int rank);

// `rank`'s share of its CPUs: their number divided by the ranks sharing them, at least 1;
// 0 where its CPUs are unknown.
int cpu_share(const std::vector<RankCpus>& ranks, int rank);

// A warning when `threads` threads in every rank on `host` are more than some rank's share of
// its CPUs there (which is at least 1: more ranks than CPUs is no thread count's doing);
// nullopt otherwise.
std::optional<std::string> host_oversubscription(const std::vector<RankCpus>& ranks,
                                                 const std::string& host, int threads);

// A note when the ranks on `host`, each on CPUs of its own, may run on fewer of them than
// `launcher_cpus`, those of the mpirun (or Open MPI daemon) that started them: mpirun binds each
// of 2 or fewer ranks to a core of its own. Nullopt otherwise, and where ranks share CPUs (a
// restriction such as --cpu-set, placed on purpose).
std::optional<std::string> host_underuse(const std::vector<RankCpus>& ranks,
                                         const std::string& host,
                                         const std::vector<int>& launcher_cpus);

// The thread count OMP_NUM_THREADS sets, as OpenMP reads it: the first of a list of whole
// numbers above 0 separated by commas ("4" or "4,2"); nullopt when it is unset, blank or
// anything else, which OpenMP ignores.
std::optional<int> omp_num_threads(const char* value);

// Sets this rank's OpenMP threads to its share, unless OMP_NUM_THREADS sets a count; then the
// lowest rank of each host prints host_oversubscription's warning, if any. Under mpirun that
// rank also prints host_underuse's note against mpirun's CPUs, unless the CPUs were chosen with
// `mpirun --cpu-set`. Returns how many CPUs the rank's threads run on at once: their count, or
// its share of the CPUs where that is fewer (threads beyond it take turns).
int set_cpu_threads(const dist::World& world);

}  // namespace mantissa::launcher
