// DataParallel for a job started by mpirun or srun: the communicator is chosen by
// dist.backend and the device, and an NCCL communicator is bootstrapped over MPI (rank 0's
// unique id broadcast, World's timeout handling). Kept apart from data_parallel.cpp, so that
// DataParallel and NCCL build without MPI (the GPU check machine has none).
#include "core/error.h"
#include "dist/data_parallel.h"
#include "dist/mpi/mpi_communicator.h"
#include "dist/nccl/nccl_communicator.h"

namespace mantissa::dist {
namespace {

NcclJob nccl_job_over_mpi(const World& world, double timeout_s) {
  NcclJob job;
  job.rank = world.rank();
  job.size = world.size();
  job.broadcast_from_rank0 = [&world, timeout_s](std::span<std::byte> bytes) {
    core::Tensor buf = core::Tensor::wrap(
        bytes.data(), core::Shape{static_cast<int64_t>(bytes.size())}, core::DType::kU8);
    make_mpi_communicator(world, timeout_s)->broadcast(buf, 0)->wait();
  };
  job.on_timeout = [&world](const std::string& what, double waited_s) {
    world.abort_on_timeout(what, waited_s);
  };
  job.abort = [&world](int exit_code, const std::string& message) {
    world.abort(exit_code, message);
  };
  return job;
}

}  // namespace

std::unique_ptr<DataParallel> DataParallel::create(World& world, core::Backend& backend,
                                                   train::ParameterStore& params,
                                                   const DistConfig& config) {
  validate(config);  // before the communicator is built from it
  const bool on_gpu = !backend.device().is_cpu();
  CommBackend kind = config.backend;
  if (kind == CommBackend::kAuto) kind = on_gpu ? CommBackend::kNCCL : CommBackend::kMPI;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Communicator> host_scalars;
  if (kind == CommBackend::kMPI) {
    MANTISSA_CHECK(!on_gpu, "dist.backend MPI reduces host buffers, but the model is on "
                                << backend.device().str() << "; use NCCL (or AUTO)");
    comm = make_mpi_communicator(world, config.timeout_s);
  } else {
    MANTISSA_CHECK(on_gpu, "dist.backend NCCL needs a CUDA device, but the model is on "
                               << backend.device().str() << "; use MPI (or AUTO)");
    comm = make_nccl_communicator(nccl_job_over_mpi(world, config.timeout_s), backend,
                                  config.timeout_s);
    host_scalars = make_mpi_communicator(world, config.timeout_s);
  }
  // A job of one rank has nothing to reduce: a round trip through a reduced dtype would only
  // round its gradients, and hold a second copy of them.
  DistConfig job_config = config;
  if (world.size() == 1) {
    job_config.grad_reduce_dtype = core::DType::kF32;
    job_config.accumulate_fp32 = false;
  }
  std::unique_ptr<DataParallel> dp =
      create(backend, params, job_config, std::move(comm), std::move(host_scalars));
  dp->set_rank_hosts(world.hosts());
  return dp;
}

}  // namespace mantissa::dist
