// Every CUDA runtime and cuBLASLt call is checked; a failure throws core::Error naming the
// call, its status and the source location.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define MANTISSA_CUDA_CHECK(call)                                                         \
  do {                                                                                    \
    const cudaError_t mantissa_cuda_status = (call);                                      \
    MANTISSA_CHECK(mantissa_cuda_status == cudaSuccess,                                   \
                   #call << " failed: " << cudaGetErrorName(mantissa_cuda_status) << " (" \
                         << cudaGetErrorString(mantissa_cuda_status) << ")");             \
  } while (0)

#define MANTISSA_CUBLAS_CHECK(call)                                                              \
  do {                                                                                           \
    const cublasStatus_t mantissa_cublas_status = (call);                                        \
    MANTISSA_CHECK(mantissa_cublas_status == CUBLAS_STATUS_SUCCESS,                              \
                   #call << " failed: " << cublasLtGetStatusName(mantissa_cublas_status) << " (" \
                         << cublasLtGetStatusString(mantissa_cublas_status) << ")");             \
  } while (0)

// Kernel launches: check the launch itself (configuration errors) without synchronising.
#define MANTISSA_CUDA_CHECK_LAUNCH() MANTISSA_CUDA_CHECK(cudaGetLastError())
