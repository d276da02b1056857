// World::unresponsive_ranks, the probe a rank runs when a collective timed out: the ranks that
// probe together answer each other, and a rank that comes to the probe after the others have
// left it (stopped, then woken, while they aborted) finds them silent, their pings to it
// notwithstanding. The second test leaves messages behind on the probe communicator, so it
// runs last in this program.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "tests/dist/dist_test.h"

namespace mantissa::dist::testing {
namespace {

TEST(Probe, RanksProbingTogetherAllAnswer) {
  const World& w = world();
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(w.unresponsive_ranks(30.0), std::vector<int>{});
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Probe, ARankThatLeftTheProbeDoesNotAnswerALateOne) {
  const World& w = world();
  // Rank 0 probes alone: nobody answers it, but its pings wait in every other rank's queue.
  if (w.rank() == 0) {
    std::vector<int> others;
    for (int r = 1; r < w.size(); ++r) others.push_back(r);
    EXPECT_EQ(w.unresponsive_ranks(0.5), others);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The others probe once rank 0 has left the probe: they answer each other, and its ping to
  // them must not count as its answer.
  if (w.rank() != 0) {
    EXPECT_EQ(w.unresponsive_ranks(2.0), std::vector<int>{0});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace mantissa::dist::testing
