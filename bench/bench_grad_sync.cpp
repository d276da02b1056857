// Gradient sync of 1, 16 and 128 MiB of FP32 gradients across the ranks of an mpirun: our
// FP32, BF16 and FP8 paths (DataParallel: finiteness check, cast, reduce, widen back; 25 MiB
// buckets) next to a plain blocking MPI_Allreduce of the FP32 buffer, whole and in 25 MiB
// pieces, timed in the same run. Figures only (the median of several repetitions).
//
//   OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 build/bin/bench_grad_sync [MiB...]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "core/dtype/dtype.h"
#include "core/ops/cpu_switches.h"
#include "dist/data_parallel.h"

using namespace mantissa;
using Clock = std::chrono::steady_clock;

namespace {

using mantissa::bench::median;

// Median seconds of `repeats` runs of `body`, each after `prepare` (not timed). Every rank
// starts each run together.
double median_seconds(int repeats, const std::function<void()>& prepare,
                      const std::function<void()>& body) {
  std::vector<double> times;
  for (int i = 0; i < repeats + 1; ++i) {  // the first run warms up (page faults, tables)
    prepare();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = Clock::now();
    body();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    // The collective is as slow as its slowest rank.
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i > 0) times.push_back(seconds);
  }
  return median(times);
}

struct Path {
  const char* name;
  core::DType dtype;
  bool accumulate_fp32;
};

}  // namespace

static int benchmark_main(dist::World& world, int argc, char** argv) {
  const bench::Arguments args(argc, argv, "bench_grad_sync [MiB >= 1]...");
  std::vector<int> sizes_mib;
  for (int i = 1; i <= args.count(); ++i) sizes_mib.push_back(args.whole<int>(i, 0, 1));
  if (sizes_mib.empty()) sizes_mib = {1, 16, 128};
  auto backend = core::make_cpu_backend();
  const Path paths[] = {{"ours FP32", core::DType::kF32, false},
                        {"ours BF16", core::DType::kBF16, false},
                        {"ours BF16 accumulate_fp32", core::DType::kBF16, true},
                        {"ours FP8_E4M3", core::DType::kE4M3, false},
                        {"ours FP8_E5M2", core::DType::kE5M2, false}};
  if (world.rank() == 0) {
    std::printf("%s\n", core::cpu_paths_description().c_str());
    std::printf(
        "gradient sync on %d ranks (median seconds; speed against MPI_Allreduce FP32, "
        "above 1x faster)\n",
        world.size());
  }
  for (int mib : sizes_mib) {
    // Parameters of 1 MiB each, like a model's weight matrices.
    const int64_t per_param = 256 * 1024;
    train::ParameterStore params;
    for (int i = 0; i < mib; ++i) {
      std::string name = "w";
      name += std::to_string(i);
      params.add({name, core::Shape{per_param}, train::Init::kZeros, 0.0f, true});
    }
    params.allocate(*backend, core::DType::kBF16, 1);
    const int64_t n = params.flat_numel();
    std::vector<float> gradients(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      gradients[static_cast<size_t>(i)] =
          (static_cast<float>(core::random_u32(world.rank() + 1, i)) / 4294967296.0f - 0.5f) *
          1e-3f;
    }
    float* grads = params.grads().data_as<float>();
    const auto refill = [&] { std::memcpy(grads, gradients.data(), gradients.size() * 4); };
    const int repeats = mib >= 128 ? 3 : mib >= 16 ? 5 : 20;

    const double mpi = median_seconds(repeats, refill, [&] {
      MPI_Allreduce(MPI_IN_PLACE, grads, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    // The same in 25 MiB pieces: Open MPI's blocking all-reduce slows down sharply on very
    // large buffers, so this is the fairer baseline for our 25 MiB buckets.
    const int64_t piece = 25 * 1024 * 1024 / 4;
    const double mpi_pieces = median_seconds(repeats, refill, [&] {
      for (int64_t i = 0; i < n; i += piece) {
        MPI_Allreduce(MPI_IN_PLACE, grads + i, static_cast<int>(std::min(piece, n - i)), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
      }
    });
    if (world.rank() == 0) {
      std::printf("%4d MiB  %-28s %9.4f s  %6.2f GB/s of FP32 gradients\n", mib,
                  "MPI_Allreduce FP32", mpi, n * 4 / mpi / 1e9);
      std::printf("%4d MiB  %-28s %9.4f s  %6.2f GB/s  %.2fx\n", mib, "MPI_Allreduce FP32 25 MiB",
                  mpi_pieces, n * 4 / mpi_pieces / 1e9, mpi / mpi_pieces);
    }
    for (const Path& path : paths) {
      dist::DistConfig config;
      config.backend = dist::CommBackend::kMPI;
      config.grad_reduce_dtype = path.dtype;
      config.accumulate_fp32 = path.accumulate_fp32;
      auto dp = dist::DataParallel::create(world, *backend, params, config);
      // Each step's non-finite check too, read back as the training step does.
      core::Tensor check = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
      core::Tensor host_check = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
      const double ours = median_seconds(repeats, refill, [&] {
        for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
        dp->finish(params.grads(), check);
        backend->copy(check, host_check);
        backend->synchronize();
      });
      if (world.rank() == 0) {
        std::printf("%4d MiB  %-28s %9.4f s  %6.2f GB/s  %.2fx\n", mib, path.name, ours,
                    n * 4 / ours / 1e9, mpi / ours);
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  dist::World world(&argc, &argv);
  return bench::exit_status_of("bench_grad_sync", world,
                               [&] { return benchmark_main(world, argc, argv); });
}
