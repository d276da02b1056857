// What the gradient-sync tests share: the MPI ones here (test_grad_sync, test_issue_order)
// and the NCCL one in tests/gpu (test_gpu_nccl), so nothing here needs MPI. The parameter
// layout they reduce over, and one sync configuration with its name for failure messages.
#pragma once

#include <iterator>
#include <sstream>
#include <string>

#include "core/ops/backend.h"
#include "dist/data_parallel.h"
#include "train/parameters.h"

namespace mantissa::dist::testing {

// Eight FP32-compute parameters of odd sizes, so that buckets, shards and chunks cut through
// parameters and padding; the even ones decay.
inline train::ParameterStore make_sync_store(core::Backend& backend) {
  train::ParameterStore params;
  const int64_t sizes[] = {3000, 1, 777, 4096, 130, 2500, 9, 6000};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    std::string name = "p";
    name += std::to_string(i);  // not "p" + ...: GCC 12 warns falsely about it
    params.add({name, core::Shape{sizes[i]}, train::Init::kNormal, 0.02f, i % 2 == 0});
  }
  params.allocate(backend, core::DType::kF32, 7);
  return params;
}

// finish(), its check read back at one synchronisation as the training step reads it: whether
// this rank saw a non-finite gradient.
inline bool finish_saw_nonfinite(DataParallel& dp, core::Backend& backend, core::Tensor& grads) {
  core::Tensor check = core::Tensor::empty(core::Shape{1}, core::DType::kF32, backend.device());
  dp.finish(grads, check);
  core::Tensor host = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
  backend.copy(check, host);
  backend.synchronize();
  return dp.saw_nonfinite(host.data_as<float>()[0]);
}

struct SyncCase {
  core::DType dtype;
  bool accumulate_fp32;
  int zero_stage;
  bool overlap = true;
};

inline std::string describe(const SyncCase& c) {
  std::ostringstream out;
  out << reduce_dtype_name(c.dtype) << (c.accumulate_fp32 ? " accumulate_fp32" : "") << " zero"
      << c.zero_stage << (c.overlap ? "" : " no overlap");
  return out.str();
}

// `base` with the case's reduce dtype, accumulate_fp32, ZeRO stage and overlap, and buckets of
// 0.02 MiB (5242 floats: 6 buckets over make_sync_store's parameters).
inline DistConfig sync_config(const SyncCase& c, DistConfig base) {
  base.grad_reduce_dtype = c.dtype;
  base.accumulate_fp32 = c.accumulate_fp32;
  base.zero_stage = c.zero_stage;
  base.overlap = c.overlap;
  base.bucket_mb = 0.02;
  return base;
}

}  // namespace mantissa::dist::testing
