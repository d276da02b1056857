// main() of the dist test programs: MPI first, then GoogleTest. Rank 0 prints the usual
// report; the other ranks print only their failures (prefixed with the rank), so a failure
// that happens on one rank alone is still visible.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "tests/dist/dist_test.h"

namespace mantissa::dist::testing {
namespace {

World* g_world = nullptr;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace

World& world() {
  return *g_world;
}

}  // namespace mantissa::dist::testing

int main(int argc, char** argv) {
  mantissa::dist::World world(&argc, &argv);
  mantissa::dist::testing::g_world = &world;
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mantissa::dist::testing::FailurePrinter(world.rank()));
  }
  const int local = RUN_ALL_TESTS();
  int global = local;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return global;
}
