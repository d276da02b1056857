// A CUDA stream and a CUDA event that are released with their owner. Creation is checked; the
// release is not (a destructor cannot throw, and the job is ending when it fails).
#pragma once

#include <cuda_runtime.h>

#include "core/ops/cuda/cuda_check.h"

namespace mantissa::core {

// A stream that does not synchronise with the legacy default stream.
class CudaStream {
 public:
  CudaStream() { MANTISSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() { cudaStreamDestroy(stream_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// `flags`: cudaEventDisableTiming for an event only waited on, cudaEventDefault to time with.
class CudaEvent {
 public:
  explicit CudaEvent(unsigned flags) {
    MANTISSA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
  }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace mantissa::core
