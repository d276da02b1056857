// Memory for tensors. CPU memory is 64-byte aligned (one cache line, the widest vector
// load); CUDA memory comes from a caching allocator so that per-step temporaries do not pay
// for cudaMalloc/cudaFree.
#pragma once

#include <cstddef>
#include <memory>

#include "core/tensor/tensor.h"

namespace mantissa::core {

inline constexpr size_t kCpuAlignment = 64;

std::shared_ptr<Storage> allocate_cpu(size_t nbytes);

// Defined by the CUDA backend; throws Error when the build has no CUDA.
std::shared_ptr<Storage> allocate_cuda(size_t nbytes, int device_index);

}  // namespace mantissa::core
