// Ranks sharing CPUs divide them (launcher/cpu_threads.h): unbound, bound to cores, bound to
// sockets, several hosts, unknown affinity; and when a thread count oversubscribes a host.
// Also how a process's CPUs are read (core/cpu_affinity.h).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <numeric>

#include "core/cpu_affinity.h"
#include "launcher/cpu_threads.h"

namespace mantissa::launcher {
namespace {

std::vector<int> range(int first, int count) {
  std::vector<int> cpus(static_cast<size_t>(count));
  std::iota(cpus.begin(), cpus.end(), first);
  return cpus;
}

TEST(CpuShare, UnboundRanksDivideTheirHostsCpus) {
  const std::vector<RankCpus> ranks = {
      {"a", range(0, 16)}, {"a", range(0, 16)}, {"a", range(0, 16)}};
  EXPECT_EQ(ranks_sharing_cpus(ranks, 1), (std::vector<int>{0, 1, 2}));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(cpu_share(ranks, r), 5) << "16 CPUs / 3 ranks";
}

TEST(CpuShare, RanksBoundToCoresOrSocketsKeepTheirs) {
  const std::vector<RankCpus> cores = {{"a", {0}}, {"a", {1}}};
  EXPECT_EQ(ranks_sharing_cpus(cores, 0), std::vector<int>{0});
  EXPECT_EQ(cpu_share(cores, 0), 1);
  EXPECT_EQ(cpu_share(cores, 1), 1);
  // Four ranks on two sockets of 8 CPUs, mapped round-robin: two per socket.
  const std::vector<RankCpus> sockets = {
      {"a", range(0, 8)}, {"a", range(8, 8)}, {"a", range(0, 8)}, {"a", range(8, 8)}};
  EXPECT_EQ(ranks_sharing_cpus(sockets, 1), (std::vector<int>{1, 3}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(cpu_share(sockets, r), 4) << r;
}

TEST(CpuShare, OnlyRanksOfTheSameHostShare) {
  const std::vector<RankCpus> ranks = {
      {"a", range(0, 8)}, {"a", range(0, 8)}, {"b", range(0, 8)}, {"b", range(0, 8)}};
  EXPECT_EQ(ranks_sharing_cpus(ranks, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(cpu_share(ranks, 0), 4);
  EXPECT_EQ(cpu_share(ranks, 3), 4);
}

TEST(CpuShare, MoreRanksThanCpusGetOneThreadAndUnknownAffinityNone) {
  const std::vector<RankCpus> crowded(5, RankCpus{"a", range(0, 2)});
  EXPECT_EQ(cpu_share(crowded, 4), 1);
  const std::vector<RankCpus> unknown = {{"a", {}}, {"a", range(0, 4)}};
  EXPECT_EQ(cpu_share(unknown, 0), 0) << "OpenMP's default stays";
  EXPECT_EQ(cpu_share(unknown, 1), 4) << "a rank of unknown CPUs shares none";
}

TEST(HostOversubscription, WarnsWhenAGroupRunsMoreThreadsThanItsCpus) {
  const std::vector<RankCpus> unbound = {{"a", range(0, 2)}, {"a", range(0, 2)}};
  EXPECT_FALSE(host_oversubscription(unbound, "a", 1));
  const std::optional<std::string> warning = host_oversubscription(unbound, "a", 2);
  ASSERT_TRUE(warning);
  EXPECT_NE(warning->find("host a: its 2 ranks run 2 threads each on the 2 CPUs they may use"),
            std::string::npos)
      << *warning;
  // Bound to one core each, two threads per rank take turns although the host has two CPUs.
  const std::vector<RankCpus> bound = {{"a", {0}}, {"a", {1}}, {"b", range(0, 8)}};
  EXPECT_FALSE(host_oversubscription(bound, "a", 1));
  EXPECT_TRUE(host_oversubscription(bound, "a", 2));
  EXPECT_FALSE(host_oversubscription(bound, "b", 8)) << "host b's one rank has 8 CPUs";
  EXPECT_FALSE(host_oversubscription({{"a", {}}}, "a", 64)) << "unknown CPUs: no claim";
  const std::vector<RankCpus> crowded(4, RankCpus{"a", range(0, 2)});
  EXPECT_FALSE(host_oversubscription(crowded, "a", 1)) << "no fewer threads would help";
  const std::optional<std::string> crowded_warning = host_oversubscription(crowded, "a", 2);
  ASSERT_TRUE(crowded_warning);
  EXPECT_NE(crowded_warning->find("(1 thread here)"), std::string::npos) << *crowded_warning;
}

TEST(HostUnderuse, NotesRanksBoundApartToFewerCpusThanMpirunHas) {
  const std::vector<RankCpus> cores = {{"a", {0}}, {"a", {1}}, {"b", {0}}};
  const std::optional<std::string> note = host_underuse(cores, "a", range(0, 16));
  ASSERT_TRUE(note);
  EXPECT_NE(note->find("host a: its 2 ranks may run on 2 of the 16 CPUs mpirun may use"),
            std::string::npos)
      << *note;
  const std::optional<std::string> one = host_underuse({{"a", {3}}}, "a", range(0, 4));
  ASSERT_TRUE(one);
  EXPECT_NE(one->find("host a: its rank may run on 1 of the 4 CPUs"), std::string::npos) << *one;
  EXPECT_FALSE(host_underuse(cores, "a", range(0, 2))) << "every CPU mpirun has";
  EXPECT_FALSE(host_underuse({{"a", range(0, 16)}}, "a", range(0, 16)));
  EXPECT_FALSE(host_underuse(cores, "a", {})) << "mpirun's CPUs unknown";
  EXPECT_FALSE(host_underuse(cores, "a", range(4, 8))) << "not a subset: no claim";
  EXPECT_FALSE(host_underuse({{"a", {0}}, {"a", {0}}, {"a", {0}}}, "a", range(0, 2)))
      << "ranks sharing their CPUs (--cpu-set 0) were placed so on purpose";
}

// What sched_getaffinity says, read back after this thread is restricted to one CPU.
TEST(AffinityCpus, ReadsTheKernelsMask) {
  const std::vector<int> all = core::affinity_cpus(0);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(all.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const std::vector<int> restricted = core::affinity_cpus(0);
  cpu_set_t restore;
  CPU_ZERO(&restore);
  for (const int cpu : all) CPU_SET(cpu, &restore);
  ASSERT_EQ(sched_setaffinity(0, sizeof restore, &restore), 0);
  EXPECT_EQ(restricted, std::vector<int>{all.back()});
  EXPECT_EQ(core::affinity_cpus(0), all);
  EXPECT_TRUE(core::affinity_cpus(INT_MAX).empty()) << "no such process";
}

TEST(OmpNumThreads, TakesWhatOpenMpTakes) {
  EXPECT_EQ(omp_num_threads("4"), 4);
  EXPECT_EQ(omp_num_threads(" 4 , 2"), 4) << "nested levels: the first is this one's";
  for (const char* ignored : {"", " ", "0", "-1", "abc", "4x", "4,", ",4", "4,0", "99999999999"})
    EXPECT_EQ(omp_num_threads(ignored), std::nullopt) << "'" << ignored << "'";
  EXPECT_EQ(omp_num_threads(nullptr), std::nullopt);
}

}  // namespace
}  // namespace mantissa::launcher
