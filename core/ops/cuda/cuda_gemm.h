// CublasLtGemm: the cuBLASLt side of CudaBackend::gemm.
//
// CudaBackend::gemm (cuda_gemm.cu) validates a row-major call and maps it onto one
// column-major LtMatmul; this class owns what that needs across calls: the cuBLASLt handle,
// the 32 MiB workspace, the algorithm chosen for each distinct problem, and the scratch that
// holds transposed copies of FP8 operands.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/tensor/tensor.h"

namespace mantissa::core {

// One (strided-batched) cuBLASLt product in its own column-major terms:
//   D[m, n] = scale_d * (alpha * scale_a * scale_b * op(A)[m, k] op(B)[k, n] + beta * C)
// for each of `batch` matrices. Operands are packed: op(A) is stored [rows, cols] with
// ld = rows (column-major) and consecutive batches `rows * cols` elements apart; C and D share
// one layout (C is not read when beta = 0, and is absent for FP8 D).
struct LtMatmul {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool trans_a = false;
  bool trans_b = false;
  cudaDataType_t a_type = CUDA_R_32F;
  cudaDataType_t b_type = CUDA_R_32F;
  cudaDataType_t d_type = CUDA_R_32F;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;  // C is D (in place), or unused for FP8 output
  float alpha = 1.0f;
  float beta = 0.0f;
  // FP8 only (device pointers, nullptr = 1 / not computed). scale_a and scale_b are one F32
  // each in the default mode (0, SCALAR_32F), or scale tensors in the layout of
  // scale_mode_a / scale_mode_b (cublasLtMatmulMatrixScale_t values, core/precision/
  // block_scaling.h: F32, or E8M0 bytes for VEC32_UE8M0).
  const void* scale_a = nullptr;
  const void* scale_b = nullptr;
  int32_t scale_mode_a = 0;
  int32_t scale_mode_b = 0;
  const float* scale_d = nullptr;
  float* amax_d = nullptr;
  bool fast_accumulate = false;
};

class CublasLtGemm {
 public:
  // On the current device (CudaBackend makes its device current first).
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Queues the product on `stream`. The first call for a new kind of problem asks cuBLASLt's
  // heuristics for up to kCandidates algorithms; each call runs the first of them that
  // cuBLASLt accepts, starting with the one that ran last (AlgorithmChoice). Returns false,
  // with the reason in `failure`, when none runs (now or on an earlier call of the problem);
  // nothing is queued then.
  bool try_matmul(const LtMatmul& p, cudaStream_t stream, std::string& failure);

  // Device memory of at least `nbytes` in one of two slots (one per operand), reused by later
  // calls. It comes from the caching allocator (allocate_cuda): growing it needs no wait for
  // the device (the old block goes back to the cache, where only work queued after it on the
  // same stream can take it), and an out-of-memory there first releases the idle cached
  // blocks, which a cudaMalloc of its own could not use.
  void* scratch(int slot, size_t nbytes, int device_index);

  // How many algorithms a plan asks the heuristic for.
  static constexpr int kCandidates = 8;

 private:
  // Everything the algorithm choice depends on: the problem (shape, types, transposes,
  // batch), the FP8 extras set on the descriptor, and how well the pointers are aligned (the
  // fastest kernels need 16-byte or better alignment; views into flat buffers may lack it).
  struct PlanKey {
    int64_t batch, m, n, k;
    int32_t a_type, b_type, d_type;
    bool trans_a, trans_b, fast_accumulate;
    bool reads_c;  // beta != 0: an algorithm that runs D = AB may still refuse to read C
    bool scale_a, scale_b, scale_d, amax_d;
    int32_t scale_mode_a, scale_mode_b;
    uint32_t align_a, align_b, align_d;
    bool operator==(const PlanKey& other) const;
  };
  struct PlanKeyHash {
    size_t operator()(const PlanKey& key) const;
  };
  struct Plan;  // descriptors, the candidate algorithms and the choice, see cuda_gemm.cu
  // Descriptors for a new kind of problem, and the heuristic's candidates for it.
  std::unique_ptr<Plan> make_plan(const PlanKey& key, const LtMatmul& p);

  struct HandleDeleter {
    void operator()(cublasLtContext* handle) const;
  };
  struct DeviceFree {
    void operator()(void* memory) const;
  };
  using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

  std::unique_ptr<cublasLtContext, HandleDeleter> handle_;
  DeviceBuffer workspace_;
  std::shared_ptr<Storage> scratch_[2];
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
};

}  // namespace mantissa::core
