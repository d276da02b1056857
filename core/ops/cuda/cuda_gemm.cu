// CudaBackend::gemm through cuBLASLt, with the semantics of backend.h and CpuBackend::gemm.
//
// Row-major onto column-major. cuBLASLt reads matrices column-major, and a row-major [r, c]
// buffer read column-major is its transpose. So the row-major C = op(A) op(B) is computed as
// the column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second is
// our A, its m and n are our n and m, and each transpose flag carries over to the operand it
// belongs to. C^T read column-major is exactly our row-major C, so nothing is copied.
//
// Numerics. CUBLAS_COMPUTE_32F with FP32 scale type: FP32 products and accumulation (TF32
// is never used, so F32 GEMMs are full precision), alpha and beta in FP32, one rounding into
// the output dtype. FP8 dequantize factors go to the A/B scale pointers (applied once to the
// accumulated sum, as on the CPU), the quantize factor of an FP8 output to the D scale
// pointer, and cuBLASLt's AMAX_D returns max |value| before that scale.
//
// Which output each operand dtype can produce is cuBLASLt's own type table (COMPUTE_32F),
// written down once in core/ops/gemm_checks.h and enforced there for both backends.
//
// FP8 on Hopper (and Ada) runs only in the "TN" layout: cuBLASLt's A transposed, its B not,
// i.e. in our terms A stored [m, k] (trans_a = false) and B stored [n, k] (trans_b = true):
// both operands K-major, as a Linear layer's forward x W^T is. Other combinations (the
// backward products) get a transposed copy of the offending operand first, made by a small
// kernel into scratch memory that the GEMM object keeps for reuse. FP8 also needs every
// pointer and leading dimension 16-byte aligned: K a multiple of 16, and rows of C a multiple
// of 16 bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cuda/algorithm_choice.h"
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_gemm.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/gemm_checks.h"
#include "core/tensor/allocator.h"

namespace mantissa::core {
namespace {

constexpr const char* kOp = "gemm";
// What NVIDIA recommends for Hopper; plenty for split-K and stream-K kernels elsewhere.
constexpr size_t kWorkspaceBytes = 32u << 20;
// The best alignment cuBLASLt's heuristics ask about (their default assumption).
constexpr uint32_t kMaxAlignment = 256;

// ---------------------------------------------------------------------------------------
// What the GPU checks beyond gemm_checks.h: FP8's compute capability and alignment.

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// 16-byte aligned starts of what an FP8 GEMM reads in place (check_gemm has checked the row
// lengths). An operand that is first copied transposed (copy_a, copy_b) lands in aligned
// scratch.
void check_fp8_alignment(const Tensor& a, const Tensor& b, const Tensor& c, bool copy_a,
                         bool copy_b) {
  MANTISSA_CHECK(copy_a || aligned16(a.data()),
                 kOp << ": FP8 operand A " << a.describe()
                     << " does not start at a 16-byte aligned address, which FP8 GEMMs need");
  MANTISSA_CHECK(copy_b || aligned16(b.data()),
                 kOp << ": FP8 operand B " << b.describe()
                     << " does not start at a 16-byte aligned address, which FP8 GEMMs need");
  MANTISSA_CHECK(aligned16(c.data()),
                 kOp << ": output C " << c.describe()
                     << " of an FP8 GEMM does not start at a 16-byte aligned address");
}

cudaDataType_t lt_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    default: MANTISSA_FAIL(kOp << ": no cuBLASLt type for " << dtype_name(dtype));
  }
}

bool is_fp8_type(cudaDataType_t type) {
  return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2;
}

// ---------------------------------------------------------------------------------------
// Small kernels.

// out[b][c][r] = in[b][r][c] for `batch` byte matrices of rows x cols (FP8 operands into the
// layout the tensor cores want). Each block moves 32x32 tiles through shared memory so that
// both the reads and the writes are coalesced; the extra column keeps the transposed reads
// out of each other's banks.
constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a block is kTile x kTileRows threads, each moving 4 bytes

__global__ void transpose_bytes_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out,
                                       int64_t rows, int64_t cols, int64_t batch) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t tile_rows = ceil_div(rows, kTile);
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const uint8_t* src = in + b * rows * cols;
    uint8_t* dst = out + b * rows * cols;
    for (int64_t tr = blockIdx.y; tr < tile_rows; tr += gridDim.y) {
      const int64_t row0 = tr * kTile;
      const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
      for (int i = threadIdx.y; i < kTile; i += kTileRows) {
        const int64_t r = row0 + i;
        const int64_t c = col0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
      }
      __syncthreads();
      // The transposed tile: output row = input column, output column = input row.
      for (int i = threadIdx.y; i < kTile; i += kTileRows) {
        const int64_t c = col0 + i;
        const int64_t r = row0 + threadIdx.x;
        if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
      }
      __syncthreads();
    }
  }
}

void transpose_bytes(const void* in, void* out, int64_t rows, int64_t cols, int64_t batch,
                     cudaStream_t stream) {
  constexpr int64_t kMaxGridYZ = 65535;
  const dim3 block(kTile, kTileRows);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)),
                  static_cast<unsigned>(std::min(ceil_div(rows, kTile), kMaxGridYZ)),
                  static_cast<unsigned>(std::min(batch, kMaxGridYZ)));
  transpose_bytes_kernel<<<grid, block, 0, stream>>>(static_cast<const uint8_t*>(in),
                                                     static_cast<uint8_t*>(out), rows, cols, batch);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// x = beta * x, rounded back into x's dtype: a product with K = 0 (cuBLASLt wants K >= 1).
template <class T>
__global__ void scale_kernel(T* __restrict__ x, int64_t n, float beta) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = round_to<T>(beta * to_float(x[i]));
  }
}

template <class T>
void scale_in_place(Tensor& x, float beta, int sm_count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t wanted = ceil_div(x.numel(), kThreads);
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, 8LL * sm_count));
  scale_kernel<T><<<blocks, kThreads, 0, stream>>>(x.data_as<T>(), x.numel(), beta);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// RAII for cuBLASLt descriptors. Destruction failures cannot be thrown; they are reported.

void report_cleanup(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "mantissa: %s failed: %s\n", call, cublasLtGetStatusName(status));
  }
}

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const {
    report_cleanup(cublasLtMatmulDescDestroy(d), "cublasLtMatmulDescDestroy");
  }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const {
    report_cleanup(cublasLtMatrixLayoutDestroy(l), "cublasLtMatrixLayoutDestroy");
  }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    report_cleanup(cublasLtMatmulPreferenceDestroy(p), "cublasLtMatmulPreferenceDestroy");
  }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value) {
  MANTISSA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
}

// A packed column-major [rows, cols] matrix, `batch` of them back to back.
Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t batch) {
  cublasLtMatrixLayout_t raw = nullptr;
  MANTISSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows),
                                                   static_cast<uint64_t>(cols), rows));
  Layout layout(raw);
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    const int64_t stride = rows * cols;
    MANTISSA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                           &count, sizeof count));
    MANTISSA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

// The largest power of two (up to 256) that divides the address.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = kMaxAlignment;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

const char* type_name(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "?";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// CublasLtGemm

struct CublasLtGemm::Plan {
  MatmulDesc desc;
  Layout a, b, c, d;
  // The heuristic's algorithms, best first, and which of them runs (algorithm_choice.h).
  // (Wrapped in a named struct: nvcc's front end fails on destroying cuBLASLt's anonymous
  // struct types inside std::vector.)
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<Candidate> candidates;
  cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;
  AlgorithmChoice choice{0};
  // Why each candidate was refused, for the message when none runs.
  std::string refusals;
};

bool CublasLtGemm::PlanKey::operator==(const PlanKey& o) const {
  return batch == o.batch && m == o.m && n == o.n && k == o.k && a_type == o.a_type &&
         b_type == o.b_type && d_type == o.d_type && trans_a == o.trans_a && trans_b == o.trans_b &&
         fast_accumulate == o.fast_accumulate && reads_c == o.reads_c && scale_a == o.scale_a &&
         scale_b == o.scale_b && scale_d == o.scale_d && amax_d == o.amax_d &&
         scale_mode_a == o.scale_mode_a && scale_mode_b == o.scale_mode_b && align_a == o.align_a &&
         align_b == o.align_b && align_d == o.align_d;
}

size_t CublasLtGemm::PlanKeyHash::operator()(const PlanKey& key) const {
  size_t h = 0;
  const auto mix = [&h](uint64_t v) {
    h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  mix(static_cast<uint64_t>(key.batch));
  mix(static_cast<uint64_t>(key.m));
  mix(static_cast<uint64_t>(key.n));
  mix(static_cast<uint64_t>(key.k));
  mix(static_cast<uint64_t>(key.a_type) | static_cast<uint64_t>(key.b_type) << 16 |
      static_cast<uint64_t>(key.d_type) << 32);
  mix(static_cast<uint64_t>(key.trans_a) | key.trans_b << 1 | key.fast_accumulate << 2 |
      key.scale_a << 3 | key.scale_b << 4 | key.scale_d << 5 | key.amax_d << 6 | key.reads_c << 7);
  mix(static_cast<uint64_t>(static_cast<uint32_t>(key.scale_mode_a)) |
      static_cast<uint64_t>(static_cast<uint32_t>(key.scale_mode_b)) << 32);
  mix(static_cast<uint64_t>(key.align_a) | static_cast<uint64_t>(key.align_b) << 16 |
      static_cast<uint64_t>(key.align_d) << 32);
  return h;
}

void CublasLtGemm::HandleDeleter::operator()(cublasLtContext* handle) const {
  report_cleanup(cublasLtDestroy(handle), "cublasLtDestroy");
}

void CublasLtGemm::DeviceFree::operator()(void* memory) const {
  const cudaError_t status = cudaFree(memory);
  if (status != cudaSuccess) {
    std::fprintf(stderr, "mantissa: cudaFree failed: %s\n", cudaGetErrorName(status));
  }
}

CublasLtGemm::CublasLtGemm() {
  cublasLtHandle_t raw = nullptr;
  MANTISSA_CUBLAS_CHECK(cublasLtCreate(&raw));
  handle_.reset(raw);
  void* workspace = nullptr;
  MANTISSA_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  workspace_.reset(workspace);
}

CublasLtGemm::~CublasLtGemm() = default;

void* CublasLtGemm::scratch(int slot, size_t nbytes, int device_index) {
  if (!scratch_[slot] || nbytes > scratch_[slot]->nbytes()) {
    scratch_[slot].reset();  // back to the cache, which an out-of-memory retry can release
    // Round up (to 2 MiB) so that slowly growing shapes do not reallocate every step.
    scratch_[slot] =
        allocate_cuda((nbytes + (2u << 20) - 1) / (2u << 20) * (2u << 20), device_index);
  }
  return scratch_[slot]->data();
}

bool CublasLtGemm::try_matmul(const LtMatmul& p, cudaStream_t stream, std::string& failure) {
  const bool fp8 = is_fp8_type(p.a_type) || is_fp8_type(p.b_type);
  const bool fp8_out = is_fp8_type(p.d_type);
  const PlanKey key{p.batch,
                    p.m,
                    p.n,
                    p.k,
                    static_cast<int32_t>(p.a_type),
                    static_cast<int32_t>(p.b_type),
                    static_cast<int32_t>(p.d_type),
                    p.trans_a,
                    p.trans_b,
                    p.fast_accumulate,
                    p.beta != 0.0f,
                    p.scale_a != nullptr,
                    p.scale_b != nullptr,
                    p.scale_d != nullptr,
                    p.amax_d != nullptr,
                    p.scale_mode_a,
                    p.scale_mode_b,
                    alignment_of(p.a),
                    alignment_of(p.b),
                    alignment_of(p.d)};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (!slot) slot = make_plan(key, p);
  Plan& plan = *slot;
  // The scale and amax pointers change from call to call; which of them are set is part of
  // the key, so the algorithms chosen with them stay valid.
  if (fp8) {
    set_attribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_a);
    set_attribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_b);
    if (fp8_out) {
      set_attribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_d);
      set_attribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax_d);
    }
  }
  // A refused algorithm queues nothing (cuBLASLt checks before it launches), so the next one
  // can simply be tried. Only these three statuses say "this algorithm cannot run this
  // problem here"; any other (an execution failure, or a sticky error an earlier kernel left)
  // is an error of its own, reported at once instead of ending the plan as refused and
  // sending every later call to a fallback.
  const int ran = plan.choice.run([&](int i) {
    const cublasStatus_t status = cublasLtMatmul(
        handle_.get(), plan.desc.get(), &p.alpha, p.a, plan.a.get(), p.b, plan.b.get(), &p.beta,
        fp8_out ? nullptr : p.d, plan.c.get(), p.d, plan.d.get(), &plan.candidates[i].algo,
        workspace_.get(), kWorkspaceBytes, stream);
    if (status == CUBLAS_STATUS_SUCCESS) return true;
    const bool refused = status == CUBLAS_STATUS_NOT_SUPPORTED ||
                         status == CUBLAS_STATUS_INVALID_VALUE ||
                         status == CUBLAS_STATUS_ARCH_MISMATCH;
    MANTISSA_CHECK(refused, "cublasLtMatmul failed: " << cublasLtGetStatusName(status) << " ("
                                                      << cublasLtGetStatusString(status)
                                                      << "); CUDA's last error: "
                                                      << cudaGetErrorString(cudaPeekAtLastError()));
    plan.refusals += std::string(plan.refusals.empty() ? "" : ", ") + "algorithm " +
                     std::to_string(i) + ": " + cublasLtGetStatusName(status);
    return false;
  });
  if (ran >= 0) return true;
  std::ostringstream why;
  why << "cuBLASLt cannot run the column-major product D[" << p.m << ", " << p.n
      << "] = op(A) op(B), K = " << p.k << ", batch " << p.batch << ", A " << type_name(p.a_type)
      << (p.trans_a ? "^T" : "") << " x B " << type_name(p.b_type) << (p.trans_b ? "^T" : "")
      << " -> " << type_name(p.d_type) << (p.amax_d != nullptr ? " with AMAX_D" : "")
      << (p.scale_mode_a != 0 || p.scale_mode_b != 0
              ? ", scale modes " + std::to_string(p.scale_mode_a) + " x " +
                    std::to_string(p.scale_mode_b)
              : std::string())
      << ", pointer alignments " << key.align_a << "/" << key.align_b << "/" << key.align_d
      << " bytes: ";
  if (plan.candidates.empty()) {
    why << "the heuristic offers no algorithm (status "
        << cublasLtGetStatusName(plan.heuristic_status) << ")";
  } else {
    why << "each of the heuristic's " << plan.candidates.size() << " algorithms was refused ("
        << plan.refusals << ")";
  }
  failure = why.str();
  return false;
}

std::unique_ptr<CublasLtGemm::Plan> CublasLtGemm::make_plan(const PlanKey& key, const LtMatmul& p) {
  const bool fp8 = is_fp8_type(p.a_type) || is_fp8_type(p.b_type);
  const bool fp8_out = is_fp8_type(p.d_type);
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  MANTISSA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->desc.reset(desc);
  set_attribute<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (fp8) {
    set_attribute<int8_t>(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, p.fast_accumulate ? 1 : 0);
    // Block scales (core/precision/block_scaling.h): the modes say how the scale pointers'
    // tensors are laid out; the default (0) is one F32 per operand.
    if (p.scale_mode_a != 0 || p.scale_mode_b != 0) {
      set_attribute<int32_t>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, p.scale_mode_a);
      set_attribute<int32_t>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, p.scale_mode_b);
    }
    // The heuristic sees the same descriptor the calls use: which scale and amax pointers
    // are set changes which algorithms qualify (the pointers themselves are set per call).
    set_attribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_a);
    set_attribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_b);
    if (fp8_out) {
      set_attribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_d);
      set_attribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax_d);
    }
  }
  plan->a = p.trans_a ? make_layout(p.a_type, p.k, p.m, p.batch)
                      : make_layout(p.a_type, p.m, p.k, p.batch);
  plan->b = p.trans_b ? make_layout(p.b_type, p.n, p.k, p.batch)
                      : make_layout(p.b_type, p.k, p.n, p.batch);
  // An FP8 output takes a BF16 C in cuBLASLt's type table (never read: beta is 0).
  plan->c = make_layout(fp8_out ? CUDA_R_16BF : p.d_type, p.m, p.n, p.batch);
  plan->d = make_layout(p.d_type, p.m, p.n, p.batch);

  cublasLtMatmulPreference_t raw = nullptr;
  MANTISSA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  Preference preference(raw);
  const uint64_t workspace = kWorkspaceBytes;
  MANTISSA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  const uint32_t aligns[4] = {key.align_a, key.align_b, fp8_out ? kMaxAlignment : key.align_d,
                              key.align_d};
  const cublasLtMatmulPreferenceAttributes_t align_attributes[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    MANTISSA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, align_attributes[i], &aligns[i],
                                                               sizeof aligns[i]));
  }
  // A problem no algorithm supports is an answer, not an error: the plan remembers it, and the
  // caller falls back or reports it with the problem's shape (try_matmul).
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  plan->heuristic_status = cublasLtMatmulAlgoGetHeuristic(
      handle_.get(), plan->desc.get(), plan->a.get(), plan->b.get(), plan->c.get(), plan->d.get(),
      raw, kCandidates, results, &returned);
  if (plan->heuristic_status != CUBLAS_STATUS_SUCCESS) returned = 0;
  for (int i = 0; i < returned; ++i) plan->candidates.push_back({results[i].algo});
  plan->choice = AlgorithmChoice(returned);
  return plan;
}

// ---------------------------------------------------------------------------------------
// CudaBackend::gemm

void CudaBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmParams& p) {
  const Device here = device();
  const GemmShape s = check_gemm(a, b, c, p, here);

  const bool fp8 = is_fp8(a.dtype());
  // The TN layout FP8 kernels need: A stored [m, k] and B stored [n, k].
  const bool copy_a = fp8 && p.trans_a;
  const bool copy_b = fp8 && !p.trans_b;
  const bool block_scaled = p.a_scale_mode != ScaleMode::kTensor;
  if (block_scaled) {
    // No fallback to other scales: a device or library without the modes stops the call.
    const std::string unsupported = unsupported_scale_modes(p.a_scale_mode, p.b_scale_mode);
    MANTISSA_CHECK(unsupported.empty(),
                   kOp << ": A " << a.describe() << " x B " << b.describe() << ": " << unsupported);
    MANTISSA_CHECK(aligned16(p.a_scale->data()) && aligned16(p.b_scale->data()),
                   kOp << ": scale tensors a_scale " << p.a_scale->describe() << " and b_scale "
                       << p.b_scale->describe()
                       << " must start at 16-byte aligned addresses (cuBLASLt's rule)");
  }
  if (fp8) {
    MANTISSA_CHECK(compute_capability_ >= 89,
                   kOp << ": FP8 operands A " << a.describe() << " and B " << b.describe()
                       << " need FP8 tensor cores (compute capability 8.9 or newer: Ada, "
                          "Hopper), which "
                       << description_ << " does not have");
    check_fp8_alignment(a, b, c, copy_a, copy_b);
  }

  float* amax = p.c_amax != nullptr ? p.c_amax->data_as<float>() : nullptr;
  if (c.numel() == 0) {
    if (amax != nullptr) MANTISSA_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream()));
    return;
  }
  if (s.k == 0 || p.alpha == 0.0f) {
    // An empty sum, or alpha = 0 (A and B are then not read, so an inf or NaN in them does
    // not reach C, as on the CPU): C = beta * C. beta is 0 for FP8 outputs (whose amax is
    // then 0), so a C that is scaled is F32, BF16 or F16.
    if (p.beta == 0.0f) {
      MANTISSA_CUDA_CHECK(cudaMemsetAsync(c.data(), 0, c.nbytes(), stream()));
    } else {
      cuda_kernels::dispatch_f32_bf16_f16(kOp, c.dtype(), [&](auto tag) {
        scale_in_place<decltype(tag)>(c, p.beta, multiprocessor_count_, stream());
      });
    }
    if (amax != nullptr) MANTISSA_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream()));
    return;
  }

  const void* a_data = a.data();
  const void* b_data = b.data();
  if (copy_a) {  // A stored [k, m] -> [m, k]
    void* t = gemm_->scratch(0, a.nbytes(), device_index_);
    transpose_bytes(a.data(), t, s.k, s.m, s.batch, stream());
    a_data = t;
  }
  if (copy_b) {  // B stored [k, n] -> [n, k]
    void* t = gemm_->scratch(1, b.nbytes(), device_index_);
    transpose_bytes(b.data(), t, s.k, s.n, s.batch, stream());
    b_data = t;
  }

  // C^T = op(B)^T op(A)^T in column-major terms (see the top of this file).
  LtMatmul lt;
  lt.batch = s.batch;
  lt.m = s.n;
  lt.n = s.m;
  lt.k = s.k;
  lt.a = b_data;
  lt.a_type = lt_type(b.dtype());
  lt.trans_a = p.trans_b || copy_b;
  lt.b = a_data;
  lt.b_type = lt_type(a.dtype());
  lt.trans_b = p.trans_a && !copy_a;
  lt.d = c.data();
  lt.d_type = lt_type(c.dtype());
  lt.alpha = p.alpha;
  lt.beta = p.beta;
  lt.scale_a = p.b_scale != nullptr ? p.b_scale->data() : nullptr;
  lt.scale_b = p.a_scale != nullptr ? p.a_scale->data() : nullptr;
  // The scale layouts depend on each operand's rows and K only, not on how it is stored, so
  // they hold for cuBLASLt's swapped operands and for the transposed copies alike.
  lt.scale_mode_a = static_cast<int32_t>(p.b_scale_mode);
  lt.scale_mode_b = static_cast<int32_t>(p.a_scale_mode);
  lt.scale_d = p.c_scale != nullptr ? p.c_scale->data_as<const float>() : nullptr;
  lt.amax_d = amax;
  lt.fast_accumulate = fp8 && p.fast_accumulate;
  try {
    std::string failure;
    if (gemm_->try_matmul(lt, stream(), failure)) return;
    // Two kinds of problem may have no algorithm, and both are computed as a plain product
    // into FP32 scratch followed by the epilogue's work in a kernel of ours:
    //  - an FP8 output with AMAX_D (batched ones): one cast takes the amax and rounds into C
    //    with the same scale, as the epilogue does (max |value| before the scale, one
    //    saturating rounding of the FP32 result; the CPU backend does the same);
    //  - an F32 C accumulated with block scales (a weight gradient, beta = 1), should no
    //    algorithm for those modes read C: C = beta C, then C += the product (rounded to FP32
    //    first: one rounding more than the epilogue's fused sum where alpha or beta is not 1).
    const bool fp8_output = is_fp8(c.dtype()) && amax != nullptr;
    const bool accumulates = block_scaled && p.beta != 0.0f && c.dtype() == DType::kF32;
    MANTISSA_CHECK(fp8_output || accumulates, failure);
    Tensor wide = Tensor::empty(c.shape(), DType::kF32, here);
    LtMatmul f32 = lt;
    f32.d = wide.data();
    f32.d_type = CUDA_R_32F;
    f32.beta = 0.0f;
    f32.scale_d = nullptr;
    f32.amax_d = nullptr;
    std::string wide_failure;
    MANTISSA_CHECK(gemm_->try_matmul(f32, stream(), wide_failure),
                   failure << "; nor into FP32 for the fallback: " << wide_failure);
    if (accumulates) {
      if (p.beta != 1.0f) scale_in_place<float>(c, p.beta, multiprocessor_count_, stream());
      add(wide, c, c);
      return;
    }
    CastParams narrow;
    narrow.scale = p.c_scale;
    narrow.amax = p.c_amax;
    narrow.saturation = Saturation::kSatFinite;
    cast(wide, c, narrow);
  } catch (const Error& e) {
    MANTISSA_FAIL(kOp << ": A " << a.describe() << (p.trans_a ? " (transposed)" : "") << " x B "
                      << b.describe() << (p.trans_b ? " (transposed)" : "") << " -> C "
                      << c.describe() << " on " << description_ << ": " << e.what());
  }
}

// cuBLASLt's support for block scales (cuBLAS documentation, CUDA 13): the architectures of
// gpu_scale_mode_rule (block_scaling.h), and cuBLASLt 12.9 or newer for per-row, 1x128 and
// 128x128 scales, 12.8 or newer for MXFP8's 1x32 E8M0 scales.
std::string CudaBackend::unsupported_scale_modes(ScaleMode a, ScaleMode b) const {
  if (const char* rule = scale_mode_pair_rule(a, b)) return rule;
  if (std::string rule = gpu_scale_mode_rule(a, b, compute_capability_, description_);
      !rule.empty()) {
    return rule;
  }
  const size_t version = cublasLtGetVersion();
  const auto library = [&](size_t needed, const char* what) -> std::string {
    if (version >= needed) return "";
    return std::string(what) + " scales need cuBLASLt " + std::to_string(needed / 10000) + "." +
           std::to_string(needed / 100 % 100) + " or newer, this process loaded " +
           std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100);
  };
  switch (a) {
    case ScaleMode::kTensor: return "";
    case ScaleMode::kVec32Ue8m0: return library(120800, "MXFP8");
    default: return library(120900, "per-row, 1x128 and 128x128");
  }
}

}  // namespace mantissa::core
