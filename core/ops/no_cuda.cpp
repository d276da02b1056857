// The CUDA entry points of a build without nvcc: each says so clearly.
#include "core/error.h"
#include "core/ops/backend.h"
#include "core/tensor/allocator.h"

namespace mantissa::core {

std::shared_ptr<Storage> allocate_cuda(size_t nbytes, int device_index) {
  MANTISSA_FAIL("allocate_cuda: cannot allocate " << nbytes << " bytes on cuda:" << device_index
                                                  << ": this build has no CUDA backend");
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  MANTISSA_FAIL("make_cuda_backend(cuda:" << device_index
                                          << "): this build has no CUDA backend (nvcc was not "
                                             "found or MANTISSA_CUDA=OFF)");
}

bool cuda_device_available() {
  return false;
}

std::string cuda_libraries_description() {
  return "none (nvcc was not found when this build was configured, or MANTISSA_CUDA=OFF)";
}

}  // namespace mantissa::core
