#include "launcher/cpu_threads.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>

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
  std::vector<int> on_host;
  int share = threads;  // the smallest share of a rank on the host
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].host != host) continue;
    on_host.push_back(static_cast<int>(r));
    if (const int its = cpu_share(ranks, static_cast<int>(r)); its > 0)
      share = std::min(share, its);
  }
  // One thread per rank is as few as there can be: more ranks than CPUs is the launch's choice.
  if (share >= threads) return std::nullopt;
  const size_t cpus = cpus_of_all(ranks, on_host).size();
  const std::string t = std::to_string(threads);
  return "host " + host + ": " + std::to_string(on_host.size()) +
         (on_host.size() == 1 ? " rank runs " : " ranks run ") + t +
         (threads == 1 ? " thread" : " threads") + " each (OMP_NUM_THREADS=" + t + ") on the " +
         std::to_string(cpus) + (cpus == 1 ? " CPU" : " CPUs") +
         " they may use: threads take turns on a CPU, and every parallel region waits for the "
         "ones descheduled; unset OMP_NUM_THREADS, and each rank takes its share of the CPUs it "
         "may use (" +
         std::to_string(share) + (share == 1 ? " thread" : " threads") + " here)";
}

void set_cpu_threads(const dist::World& world) {
  std::vector<RankCpus> ranks;
  for (int r = 0; r < world.size(); ++r) ranks.push_back({world.host_of(r), world.cpus_of(r)});
  const char* asked = std::getenv("OMP_NUM_THREADS");
  if (!asked || !*asked) {
    if (const int share = cpu_share(ranks, world.rank()); share > 0) omp_set_num_threads(share);
    return;
  }
  const std::string& host = world.host_of(world.rank());
  for (int r = 0; r < world.rank(); ++r) {
    if (world.host_of(r) == host) return;  // a lower rank on this host speaks for it
  }
  if (const auto warning = host_oversubscription(ranks, host, omp_get_max_threads())) {
    std::fprintf(stderr, "mantissa: warning: %s\n", warning->c_str());
  }
}

}  // namespace mantissa::launcher
