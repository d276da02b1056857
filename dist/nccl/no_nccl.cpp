// Builds without CUDA, or whose CUDA toolkit lacks NCCL, have no NCCL communicator.
#include "core/error.h"
#include "dist/nccl/nccl_communicator.h"

namespace mantissa::dist {

std::unique_ptr<Communicator> make_nccl_communicator(NcclJob, core::Backend&, double) {
  throw core::ConfigError(
      "dist.backend NCCL: this build of mantissa has no NCCL (no CUDA, or NCCL was "
      "not found when it was configured)");
}

std::string nccl_version_description() {
  return "none (no CUDA, or NCCL was not found when this build was configured)";
}

}  // namespace mantissa::dist
