// Checkpoint save and load of a replicated training state (FP32 masters and both AdamW
// moments, as every rank holds them without ZeRO) across the ranks of an mpirun, the two ways
// in one run:
//  - split: every rank writes, and at a load reads, its 1/N of each buffer, and the ranks
//    all-gather the parts read (what the Trainer does);
//  - rank 0 (the anchor, what it did before): rank 0 writes everything, every rank reads all.
// Each save is fsynced and published as the Trainer's are. The page cache is not dropped: on
// one machine the figures show the cost of writing and the gain of parallel writers, not a
// shared file system's bandwidth, where a load's N-fold reads would weigh more. Figures only
// (the median of 3 after one warm-up).
//
//   OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 build/bin/bench_checkpoint [M parameters]
//   [dir]   (default 64M parameters, 768 MB of state, in ./bench_checkpoint.tmp; the directory
//   must not exist, and is removed afterwards)
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "checkpoint/checkpoint.h"
#include "dist/mpi/mpi_communicator.h"
#include "dist/world.h"

using namespace mantissa;
using Clock = std::chrono::steady_clock;

namespace {

using mantissa::bench::median;

constexpr const char* kBuffers[] = {"masters", "adam_m", "adam_v"};

// Median seconds of 3 runs of `body` after a warm-up, each as slow as its slowest rank.
double median_seconds(const std::function<void(int run)>& body) {
  std::vector<double> times;
  for (int run = 0; run < 4; ++run) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = Clock::now();
    body(run);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (run > 0) times.push_back(seconds);
  }
  return median(times);
}

}  // namespace

static int benchmark_main(dist::World& world, int argc, char** argv) {
  const bench::Arguments args(argc, argv,
                              "bench_checkpoint [M parameters in (0, 4096]] [directory]");
  args.expect_at_most(2);
  const double millions = args.number(1, 64.0, 0.0, 4096.0);
  const std::string base = args.count() >= 2 ? argv[2] : "bench_checkpoint.tmp";
  if (millions == 0.0 || base.empty()) args.fail();
  // The directory is removed afterwards: one that exists (a user's) is refused, on every rank
  // alike, before any rank writes.
  int exists = std::filesystem::exists(base) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &exists, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  if (exists) {
    if (world.rank() == 0) {
      std::fprintf(stderr,
                   "bench_checkpoint: '%s' exists: give a directory that does not (it is "
                   "removed afterwards)\n",
                   base.c_str());
    }
    return 2;
  }
  const int64_t n = static_cast<int64_t>(millions * 1e6);
  const int rank = world.rank(), size = world.size();
  const checkpoint::ReplicaPart part = checkpoint::replica_part(n, rank, size);

  std::vector<core::Tensor> whole;
  for (int b = 0; b < 3; ++b) {
    whole.push_back(core::Tensor::empty(core::Shape{n}, core::DType::kF32));
    auto* p = static_cast<float*>(whole.back().data());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((i * 7 + b) % 1000) * 1e-3f;
  }
  const auto slices_of = [&](int64_t first, int64_t elements) {
    std::vector<checkpoint::BufferSlice> slices;
    for (int b = 0; b < 3; ++b) {
      slices.push_back({kBuffers[b], n, first, whole[b].view(first, core::Shape{elements})});
    }
    return slices;
  };
  const std::vector<checkpoint::BufferSlice> all = slices_of(0, n);
  const std::vector<checkpoint::BufferSlice> mine = slices_of(part.begin, part.count);
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(checkpoint::replica_part(n, r, size).count);

  checkpoint::CheckpointGroup group{rank, size, [](double value) {
                                      MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM,
                                                    MPI_COMM_WORLD);
                                      return value;
                                    }};
  const auto checkpointer = [&](const std::string& name) {
    return checkpoint::Checkpointer({.dir = base + "/" + name, .keep = 1}, group);
  };
  checkpoint::Checkpointer split = checkpointer("split");
  checkpoint::Checkpointer rank0 = checkpointer("rank0");
  checkpoint::CheckpointState state;
  state.parameters = {{"w", core::Shape{n}, 0}};
  auto comm = dist::make_mpi_communicator(world, 600.0);

  const double save_rank0 = median_seconds([&](int run) {
    state.step = run + 1;
    rank0.save(state, rank == 0 ? all : std::vector<checkpoint::BufferSlice>{});
  });
  const double save_split = median_seconds([&](int run) {
    state.step = run + 1;
    split.save(state, mine);
  });
  const double load_all = median_seconds([&](int) { rank0.load_latest(state.parameters, all); });
  const double load_split = median_seconds([&](int) {
    split.load_latest(state.parameters, mine);
    for (int b = 0; b < 3; ++b) comm->all_gather(mine[b].data, whole[b], counts)->wait();
  });

  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::filesystem::remove_all(base);
    const double gb = 3.0 * 4.0 * static_cast<double>(n) / 1e9;
    std::printf("checkpoint of %.1fM parameters (%.2f GB of FP32 masters and moments), %d ranks\n",
                millions, gb, size);
    std::printf("save: rank 0 writes all (anchor) %.3f s, every rank its 1/%d %.3f s (%.2fx)\n",
                save_rank0, size, save_split, save_rank0 / save_split);
    std::printf(
        "load: every rank reads all (anchor) %.3f s, every rank its 1/%d and an all-gather %.3f "
        "s (%.2fx)\n",
        load_all, size, load_split, load_all / load_split);
  }
  return 0;
}

int main(int argc, char** argv) {
  dist::World world(&argc, &argv);
  return bench::exit_status_of("bench_checkpoint", world,
                               [&] { return benchmark_main(world, argc, argv); });
}
