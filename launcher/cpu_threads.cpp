#include "launcher/cpu_threads.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string_view>

#include "core/cpu_affinity.h"
#include "dist/world.h"

namespace mantissa::launcher {

namespace {

bool overlap(const std::vector<int>& a, const std::vector<int>& b) {
  auto i = a.begin(), j = b.begin();
  while (i != a.end() && j != b.end()) {
    if (*i == *j) return true;
    if (*i < *j) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

std::vector<int> cpus_of_all(const std::vector<RankCpus>& ranks, const std::vector<int>& which) {
  std::vector<int> cpus;
  for (int r : which) {
    const std::vector<int>& more = ranks[static_cast<size_t>(r)].cpus;
    std::vector<int> merged;
    std::set_union(cpus.begin(), cpus.end(), more.begin(), more.end(), std::back_inserter(merged));
    cpus = std::move(merged);
  }
  return cpus;
}

// The ranks on `host`, in rank order.
std::vector<int> ranks_on(const std::vector<RankCpus>& ranks, const std::string& host) {
  std::vector<int> on_host;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].host == host) on_host.push_back(static_cast<int>(r));
  }
  return on_host;
}

// Whether process `pid` is Open MPI's launcher or its daemon, which bind the ranks they start.
bool is_mpirun(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name == "mpirun" || name == "mpiexec" || name == "orterun" || name == "orted" ||
         name == "prterun" || name == "prted";
}

// Whether the ranks' CPUs were chosen by `mpirun --cpu-set` (Open MPI passes the set to every
// rank in this variable), not left to mpirun's default binding.
bool cpu_set_chosen() {
  const char* set = std::getenv("OMPI_MCA_hwloc_base_cpu_set");
  return set != nullptr && *set != '\0';
}

}  // namespace

std::vector<int> ranks_sharing_cpus(const std::vector<RankCpus>& ranks, int rank) {
  const RankCpus& me = ranks.at(static_cast<size_t>(rank));
  std::vector<int> sharing;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (static_cast<int>(r) == rank ||
        (ranks[r].host == me.host && overlap(ranks[r].cpus, me.cpus))) {
      sharing.push_back(static_cast<int>(r));
    }
  }
  return sharing;
}

int cpu_share(const std::vector<RankCpus>& ranks, int rank) {
  const size_t cpus = ranks.at(static_cast<size_t>(rank)).cpus.size();
  if (cpus == 0) return 0;
  const size_t sharing = ranks_sharing_cpus(ranks, rank).size();
  return static_cast<int>(std::max<size_t>(1, cpus / sharing));
}

std::optional<std::string> host_oversubscription(const std::vector<RankCpus>& ranks,
                                                 const std::string& host, int threads) {
  const std::vector<int> on_host = ranks_on(ranks, host);
  int share = threads;  // the smallest share of a rank on the host
  for (const int r : on_host) {
    if (const int its = cpu_share(ranks, r); its > 0) share = std::min(share, its);
  }
  // One thread per rank is as few as there can be: more ranks than CPUs is the launch's choice.
  if (share >= threads) return std::nullopt;
  const size_t cpus = cpus_of_all(ranks, on_host).size();
  const bool one = on_host.size() == 1;
  return "host " + host + ": " +
         (one ? std::string("its rank runs ")
              : "its " + std::to_string(on_host.size()) + " ranks run ") +
         std::to_string(threads) + (threads == 1 ? " thread" : " threads") + (one ? "" : " each") +
         " on the " + std::to_string(cpus) + (cpus == 1 ? " CPU" : " CPUs") +
         (one ? " it" : " they") +
         " may use: threads take turns on a CPU, and every parallel region waits for the ones "
         "descheduled; unset OMP_NUM_THREADS, and each rank takes its share of the CPUs it may "
         "use (" +
         std::to_string(share) + (share == 1 ? " thread" : " threads") + " here)";
}

std::optional<int> omp_num_threads(const char* value) {
  if (!value) return std::nullopt;
  std::optional<int> first;
  std::string_view rest = value;
  while (true) {
    const size_t comma = rest.find(',');
    std::string_view field = rest.substr(0, comma);
    const size_t lo = field.find_first_not_of(" \t");
    if (lo == std::string_view::npos) return std::nullopt;
    field = field.substr(lo, field.find_last_not_of(" \t") - lo + 1);
    int n = 0;
    const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), n);
    if (error != std::errc{} || end != field.data() + field.size() || n <= 0) return std::nullopt;
    if (!first) first = n;
    if (comma == std::string_view::npos) return first;
    rest.remove_prefix(comma + 1);
  }
}

std::optional<std::string> host_underuse(const std::vector<RankCpus>& ranks,
                                         const std::string& host,
                                         const std::vector<int>& launcher_cpus) {
  const std::vector<int> on_host = ranks_on(ranks, host);
  // Bound apart: no two ranks share a CPU (ranks restricted together, by --cpu-set say, were
  // placed so on purpose).
  for (const int r : on_host) {
    if (ranks[static_cast<size_t>(r)].cpus.empty() || ranks_sharing_cpus(ranks, r).size() > 1) {
      return std::nullopt;
    }
  }
  const std::vector<int> used = cpus_of_all(ranks, on_host);
  if (!std::includes(launcher_cpus.begin(), launcher_cpus.end(), used.begin(), used.end()) ||
      used.size() == launcher_cpus.size()) {
    return std::nullopt;
  }
  const bool one = on_host.size() == 1;
  return "host " + host + ": " +
         (one ? std::string("its rank") : "its " + std::to_string(on_host.size()) + " ranks") +
         " may run on " + std::to_string(used.size()) + " of the " +
         std::to_string(launcher_cpus.size()) +
         " CPUs mpirun may use: mpirun binds each of 2 or fewer ranks to a core of its own "
         "unless given `--bind-to none`, with which the ranks divide all " +
         std::to_string(launcher_cpus.size());
}

int set_cpu_threads(const dist::World& world) {
  std::vector<RankCpus> ranks;
  for (int r = 0; r < world.size(); ++r) ranks.push_back({world.host_of(r), world.cpus_of(r)});
  const char* asked = std::getenv("OMP_NUM_THREADS");
  const std::string& host = world.host_of(world.rank());
  const bool speaks_for_host = ranks_on(ranks, host).front() == world.rank();  // the lowest
  if (speaks_for_host && is_mpirun(getppid()) && !cpu_set_chosen()) {
    const std::optional<std::string> note =
        host_underuse(ranks, host, core::affinity_cpus(getppid()));
    if (note) std::fprintf(stderr, "mantissa: note: %s\n", note->c_str());
  }

  const int share = cpu_share(ranks, world.rank());
  if (const std::optional<int> threads = omp_num_threads(asked)) {
    if (speaks_for_host) {
      if (const auto warning = host_oversubscription(ranks, host, *threads)) {
        std::fprintf(stderr, "mantissa: warning: OMP_NUM_THREADS='%s': %s\n", asked,
                     warning->c_str());
      }
    }
    return share > 0 ? std::min(*threads, share) : *threads;
  }
  if (asked && speaks_for_host) {
    std::fprintf(stderr,
                 "mantissa: warning: host %s: OMP_NUM_THREADS='%s' is not a thread count (whole "
                 "numbers above 0, separated by commas), which OpenMP ignores: each rank takes "
                 "its share of the CPUs it may use\n",
                 host.c_str(), asked);
  }
  if (share > 0) omp_set_num_threads(share);
  return omp_get_max_threads();
}

}  // namespace mantissa::launcher
