// Builds without CUDA have no NCCL.
#include "core/error.h"
#include "dist/nccl/nccl_communicator.h"

namespace mantissa::dist {

std::unique_ptr<Communicator> make_nccl_communicator(const World&, core::Backend&, double) {
  MANTISSA_FAIL("dist.backend NCCL: this build of mantissa has no CUDA (and so no NCCL)");
}

}  // namespace mantissa::dist
