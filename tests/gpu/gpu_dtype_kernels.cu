// The GPU side of test_gpu_dtype.cpp: every input of a conversion goes through dtype.h's
// device code and through CUDA's intrinsic on the same thread, and only the disagreements
// are counted (the 2^32 results themselves never leave the device).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <memory>

#include "core/dtype/dtype.h"
#include "core/ops/cuda/cuda_check.h"
#include "tests/gpu/gpu_dtype_kernels.h"

namespace mantissa::core::gpu_dtype_test {
namespace {

// The inputs compared and the disagreements found so far, kept on the device.
struct Tally {
  unsigned long long checked;  // counted by the threads, so that an input skipped shows
  unsigned long long mismatches;
  unsigned long long first;  // smallest mismatching input; all ones while there is none
};

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};

std::unique_ptr<Tally, DeviceFree> new_tally() {
  void* p = nullptr;
  MANTISSA_CUDA_CHECK(cudaMalloc(&p, sizeof(Tally)));
  std::unique_ptr<Tally, DeviceFree> tally(static_cast<Tally*>(p));
  MANTISSA_CUDA_CHECK(cudaMemset(&tally->checked, 0, sizeof tally->checked));
  MANTISSA_CUDA_CHECK(cudaMemset(&tally->mismatches, 0, sizeof tally->mismatches));
  MANTISSA_CUDA_CHECK(cudaMemset(&tally->first, 0xFF, sizeof tally->first));
  return tally;
}

Report read_tally(const Tally* device_tally) {
  Tally tally{};
  MANTISSA_CUDA_CHECK(cudaMemcpy(&tally, device_tally, sizeof tally, cudaMemcpyDeviceToHost));
  Report report;
  report.checked = tally.checked;
  report.mismatches = tally.mismatches;
  report.first_input = static_cast<uint32_t>(tally.first);
  return report;
}

__device__ void record_mismatch(Tally* tally, uint64_t input) {
  atomicAdd(&tally->mismatches, 1ull);
  atomicMin(&tally->first, static_cast<unsigned long long>(input));
}

constexpr int kBlock = 256;
constexpr int kGrid = 4096;  // grid-stride; plenty to fill any GPU

// ---------------------------------------------------------------------------------------
// FP32 -> storage dtype

__device__ uint32_t encode_ours(Encoding encoding, float x) {
  switch (encoding) {
    case Encoding::kE4M3SatFinite: return e4m3_from_float(x, Saturation::kSatFinite).bits;
    case Encoding::kE4M3NoSat: return e4m3_from_float(x, Saturation::kNoSat).bits;
    case Encoding::kE5M2SatFinite: return e5m2_from_float(x, Saturation::kSatFinite).bits;
    case Encoding::kE5M2NoSat: return e5m2_from_float(x, Saturation::kNoSat).bits;
    case Encoding::kBF16: return bf16_from_float(x).bits;
    case Encoding::kF16: return fp16_from_float(x).bits;
  }
  return 0;
}

__device__ uint32_t encode_cuda(Encoding encoding, float x) {
  switch (encoding) {
    case Encoding::kE4M3SatFinite: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    case Encoding::kE4M3NoSat: return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
    case Encoding::kE5M2SatFinite: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    case Encoding::kE5M2NoSat: return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
    case Encoding::kBF16: return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    case Encoding::kF16: return __half_as_ushort(__float2half_rn(x));
  }
  return 0;
}

// Whether a code of the encoding's format is a NaN (decoded with dtype.h, whose decodings
// are themselves compared with CUDA's below).
__device__ bool is_nan_code(Encoding encoding, uint32_t code) {
  switch (encoding) {
    case Encoding::kE4M3SatFinite:
    case Encoding::kE4M3NoSat: return isnan(e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(code)}));
    case Encoding::kE5M2SatFinite:
    case Encoding::kE5M2NoSat: return isnan(e5m2_to_float(fp8_e5m2{static_cast<uint8_t>(code)}));
    case Encoding::kBF16: return isnan(bf16_to_float(bf16{static_cast<uint16_t>(code)}));
    case Encoding::kF16: return isnan(fp16_to_float(fp16{static_cast<uint16_t>(code)}));
  }
  return false;
}

// Inputs [begin, begin + count) as FP32 bit patterns.
__global__ void compare_encoding_kernel(Encoding encoding, uint64_t begin, uint64_t count,
                                        Tally* tally) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long compared = 0;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < count;
       k += stride, ++compared) {
    const uint64_t input = begin + k;
    const float x = __uint_as_float(static_cast<uint32_t>(input));
    const uint32_t ours = encode_ours(encoding, x);
    const uint32_t cuda = encode_cuda(encoding, x);
    if (ours != cuda && !(is_nan_code(encoding, ours) && is_nan_code(encoding, cuda))) {
      record_mismatch(tally, input);
    }
  }
  atomicAdd(&tally->checked, compared);
}

// Both results for one input, for the report.
__global__ void encode_one_kernel(Encoding encoding, uint32_t input, uint32_t* out) {
  const float x = __uint_as_float(input);
  out[0] = encode_ours(encoding, x);
  out[1] = encode_cuda(encoding, x);
}

// ---------------------------------------------------------------------------------------
// storage dtype -> FP32

__device__ float decode_ours(Decoding decoding, uint32_t code) {
  switch (decoding) {
    case Decoding::kE4M3: return e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(code)});
    case Decoding::kE5M2: return e5m2_to_float(fp8_e5m2{static_cast<uint8_t>(code)});
    case Decoding::kBF16: return bf16_to_float(bf16{static_cast<uint16_t>(code)});
    case Decoding::kF16: return fp16_to_float(fp16{static_cast<uint16_t>(code)});
  }
  return 0.0f;
}

__device__ float decode_cuda(Decoding decoding, uint32_t code) {
  const auto fp8 = static_cast<__nv_fp8_storage_t>(code);
  switch (decoding) {
    case Decoding::kE4M3: return __half2float(__half(__nv_cvt_fp8_to_halfraw(fp8, __NV_E4M3)));
    case Decoding::kE5M2: return __half2float(__half(__nv_cvt_fp8_to_halfraw(fp8, __NV_E5M2)));
    case Decoding::kBF16:
      return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(code)));
    case Decoding::kF16: return __half2float(__ushort_as_half(static_cast<unsigned short>(code)));
  }
  return 0.0f;
}

__global__ void compare_decoding_kernel(Decoding decoding, uint32_t count, Tally* tally,
                                        uint32_t* first_results) {
  unsigned long long compared = 0;
  for (uint32_t code = blockIdx.x * blockDim.x + threadIdx.x; code < count;
       code += gridDim.x * blockDim.x, ++compared) {
    const float ours = decode_ours(decoding, code);
    const float cuda = decode_cuda(decoding, code);
    if (__float_as_uint(ours) != __float_as_uint(cuda) && !(isnan(ours) && isnan(cuda))) {
      record_mismatch(tally, code);
    }
  }
  atomicAdd(&tally->checked, compared);
  // The launch is one block: after this barrier every mismatch is recorded, and thread 0
  // reports both results for the first one.
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0 && tally->first < count) {
    first_results[0] = __float_as_uint(decode_ours(decoding, static_cast<uint32_t>(tally->first)));
    first_results[1] = __float_as_uint(decode_cuda(decoding, static_cast<uint32_t>(tally->first)));
  }
}

}  // namespace

Report compare_encoding(Encoding encoding) {
  const auto tally = new_tally();
  constexpr uint64_t kAll = uint64_t{1} << 32;
  constexpr uint64_t kChunk = uint64_t{1} << 28;
  for (uint64_t begin = 0; begin < kAll; begin += kChunk) {
    compare_encoding_kernel<<<kGrid, kBlock>>>(encoding, begin, kChunk, tally.get());
    MANTISSA_CUDA_CHECK_LAUNCH();
  }
  MANTISSA_CUDA_CHECK(cudaDeviceSynchronize());
  Report report = read_tally(tally.get());
  if (report.mismatches > 0) {
    void* p = nullptr;
    MANTISSA_CUDA_CHECK(cudaMalloc(&p, 2 * sizeof(uint32_t)));
    std::unique_ptr<uint32_t, DeviceFree> results(static_cast<uint32_t*>(p));
    encode_one_kernel<<<1, 1>>>(encoding, report.first_input, results.get());
    MANTISSA_CUDA_CHECK_LAUNCH();
    uint32_t host[2] = {};
    MANTISSA_CUDA_CHECK(cudaMemcpy(host, results.get(), sizeof host, cudaMemcpyDeviceToHost));
    report.ours = host[0];
    report.cuda = host[1];
  }
  return report;
}

Report compare_decoding(Decoding decoding) {
  const auto tally = new_tally();
  const uint32_t count = decoding == Decoding::kE4M3 || decoding == Decoding::kE5M2 ? 256 : 65536;
  void* p = nullptr;
  MANTISSA_CUDA_CHECK(cudaMalloc(&p, 2 * sizeof(uint32_t)));
  std::unique_ptr<uint32_t, DeviceFree> results(static_cast<uint32_t*>(p));
  compare_decoding_kernel<<<1, 1024>>>(decoding, count, tally.get(), results.get());
  MANTISSA_CUDA_CHECK_LAUNCH();
  MANTISSA_CUDA_CHECK(cudaDeviceSynchronize());
  Report report = read_tally(tally.get());
  if (report.mismatches > 0) {
    uint32_t host[2] = {};
    MANTISSA_CUDA_CHECK(cudaMemcpy(host, results.get(), sizeof host, cudaMemcpyDeviceToHost));
    report.ours = host[0];
    report.cuda = host[1];
  }
  return report;
}

}  // namespace mantissa::core::gpu_dtype_test
