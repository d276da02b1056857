// CudaBackend: construction, device discovery, and the memory ops (copy, fill).
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_gemm.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

// The number of visible devices, or 0 when the runtime cannot use any. No driver or no
// device is the normal answer on a CPU machine. Any other failure where a driver is installed
// (one older than the toolkit, a broken installation) is printed once, so that a GPU machine
// whose tests all report "skipped: no CUDA device" says why.
int visible_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count;
  cudaGetLastError();  // clear it, so that it does not surface in a later check
  static const bool reported = [status] {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    cudaRuntimeGetVersion(&runtime);
    if (status != cudaErrorNoDevice && driver != 0) {
      std::fprintf(stderr,
                   "CUDA runtime: cudaGetDeviceCount failed: %s (%s); driver for CUDA %d.%d, "
                   "runtime %d.%d; no device used\n",
                   cudaGetErrorName(status), cudaGetErrorString(status), driver / 1000,
                   driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    }
    return true;
  }();
  (void)reported;
  return 0;
}

// Writes `pattern` (the bit pattern of one element) into every element of a buffer of
// `Word`s. Zero patterns never get here: cudaMemsetAsync does those.
template <class Word>
__global__ void fill_kernel(Word* __restrict__ out, int64_t n, Word pattern) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = pattern;
  }
}

template <class Word>
void launch_fill(void* out, int64_t n, Word pattern, int sm_count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  // A few blocks per SM saturate the write bandwidth; the grid-stride loop covers the rest.
  const int64_t wanted = ceil_div(n, kThreads);
  const int blocks = static_cast<int>(wanted < 8LL * sm_count ? wanted : 8LL * sm_count);
  fill_kernel<Word><<<blocks, kThreads, 0, stream>>>(static_cast<Word*>(out), n, pattern);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// The bit pattern of `value` stored as `dtype` (floats rounded as dtype.h rounds them, the
// integers truncated, as on the CPU), in the low dtype_size(dtype) bytes.
uint64_t fill_pattern(DType dtype, float value) {
  switch (dtype) {
    case DType::kF32: return float_to_bits(value);
    case DType::kBF16: return round_to<bf16>(value).bits;
    case DType::kF16: return round_to<fp16>(value).bits;
    case DType::kE4M3: return round_to<fp8_e4m3>(value).bits;
    case DType::kE5M2: return round_to<fp8_e5m2>(value).bits;
    case DType::kI32: return static_cast<uint32_t>(static_cast<int32_t>(value));
    case DType::kI64: return static_cast<uint64_t>(static_cast<int64_t>(value));
    case DType::kU8: return static_cast<uint8_t>(value);
  }
  MANTISSA_FAIL("fill: unknown dtype " << static_cast<int>(dtype));
}

}  // namespace

CudaBackend::CudaBackend(int device_index) : device_index_(device_index) {
  const int count = visible_device_count();
  MANTISSA_CHECK(count > 0, "make_cuda_backend(cuda:" << device_index
                                                      << "): no CUDA device is visible (no "
                                                         "driver, or CUDA_VISIBLE_DEVICES hides "
                                                         "them all)");
  MANTISSA_CHECK(device_index >= 0 && device_index < count,
                 "make_cuda_backend(cuda:" << device_index << "): no such device, " << count
                                           << " visible (cuda:0 to cuda:" << count - 1 << ")");
  // Every op of this backend runs with this device current; the training loop is one rank per
  // device and one thread per rank.
  MANTISSA_CUDA_CHECK(cudaSetDevice(device_index));
  int major = 0;
  int minor = 0;
  MANTISSA_CUDA_CHECK(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
  MANTISSA_CUDA_CHECK(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index));
  compute_capability_ = major * 10 + minor;
  cudaDeviceProp props{};
  MANTISSA_CUDA_CHECK(cudaGetDeviceProperties(&props, device_index));
  description_ = "cuda:" + std::to_string(device_index) + " (" + props.name +
                 ", compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                 ")";
  MANTISSA_CUDA_CHECK(
      cudaDeviceGetAttribute(&multiprocessor_count_, cudaDevAttrMultiProcessorCount, device_index));
  MANTISSA_CUDA_CHECK(cudaDeviceGetAttribute(
      &max_shared_per_block_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index));
  gemm_ = std::make_unique<CublasLtGemm>();
  // On the device cudaSetDevice chose above, hence made here rather than as the members are.
  stream_.emplace();
}

CudaBackend::~CudaBackend() {
  // Outstanding work may still use the GEMM workspace, released before the stream: let it
  // finish first. A destructor cannot throw, so a failure is reported and otherwise ignored.
  if (const cudaError_t synced = cudaStreamSynchronize(stream()); synced != cudaSuccess) {
    std::fprintf(stderr, "mantissa: finishing the work of cuda:%d failed: %s\n", device_index_,
                 cudaGetErrorString(synced));
  }
}

void CudaBackend::synchronize() {
  ++host_syncs_;
  MANTISSA_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  MANTISSA_CHECK(src.defined() && dst.defined(), "copy: src " << src.describe() << " or dst "
                                                              << dst.describe()
                                                              << " is an undefined tensor");
  check_copy_sizes(src, dst);
  const Device here = device();
  MANTISSA_CHECK((src.device() == here || src.device().is_cpu()) &&
                     (dst.device() == here || dst.device().is_cpu()),
                 "copy: src " << src.describe() << " and dst " << dst.describe()
                              << " must each be on the host or on this backend's device "
                              << here.str());
  if (src.nbytes() == 0) return;
  // With unified addressing the runtime tells host from device pointers itself. From pageable
  // host memory the call returns once the source has been staged (it may be reused at once);
  // into host memory the data is there after synchronize(). (Into pageable memory the call
  // itself waits for the copy; the synchronize() every reader follows it with then finds the
  // stream drained, and host_syncs() counts that one wait once.)
  MANTISSA_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream()));
}

void CudaBackend::fill(Tensor& dst, float value) {
  check_fill(dst, device());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const uint64_t pattern = fill_pattern(dst.dtype(), value);
  const size_t width = dtype_size(dst.dtype());
  // Byte-sized elements, and any all-zero pattern (the common case: zeroing gradients), are
  // a memset.
  if (width == 1 || pattern == 0) {
    MANTISSA_CUDA_CHECK(
        cudaMemsetAsync(dst.data(), static_cast<int>(pattern & 0xFF), dst.nbytes(), stream()));
    return;
  }
  switch (width) {
    case 2:
      launch_fill<uint16_t>(dst.data(), n, static_cast<uint16_t>(pattern), multiprocessor_count_,
                            stream());
      return;
    case 4:
      launch_fill<uint32_t>(dst.data(), n, static_cast<uint32_t>(pattern), multiprocessor_count_,
                            stream());
      return;
    default: launch_fill<uint64_t>(dst.data(), n, pattern, multiprocessor_count_, stream()); return;
  }
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<CudaBackend>(device_index);
}

bool cuda_device_available() {
  return visible_device_count() > 0;
}

std::string cuda_libraries_description() {
  const auto major_minor = [](int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
  };
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  const size_t cublaslt = cublasLtGetVersion();
  const int devices = visible_device_count();
  return "CUDA runtime " + major_minor(runtime) + ", driver " +
         (driver == 0 ? std::string("none") : "for CUDA " + major_minor(driver)) + ", cuBLASLt " +
         std::to_string(cublaslt / 10000) + "." + std::to_string(cublaslt / 100 % 100) + "." +
         std::to_string(cublaslt % 100) + ", built for sm " MANTISSA_CUDA_ARCHITECTURES ", " +
         std::to_string(devices) + (devices == 1 ? " device" : " devices") + " visible";
}

}  // namespace mantissa::core
