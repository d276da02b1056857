// The NCCL path end to end on one GPU, without MPI: an NCCL communicator of size 1 (the
// NcclJob of a lone process: no unique id to share) on device buffers, and DataParallel's
// gradient sync over it on the CUDA backend.
//
// At world size 1 every collective is the identity (a sum or max over one rank is that
// rank's value, every chunk is this rank's own), so each result must equal its host
// reference bit for bit. That still exercises what only a GPU shows: NCCL's handling of every
// dtype (FP8 sums need sm_90), the non-blocking communicator (ncclInProgress polling on init,
// split and group end), out-of-place results, odd sizes, and the ordering of the
// communicator's stream after the backend's (each input is written by a kernel on the
// backend's stream just before the collective is posted: a missing event would let NCCL read
// stale data). Outputs and inputs start as NaN (poisoned), so that a collective that writes
// nothing, or reads its input too early, cannot pass on bytes the allocator left there. What
// size 1 cannot show: a wrong NCCL datatype of the same width, or a wrong reduction op.
//
// Gradient sync at world size 1 is the cast round trip: g -> round(g q) in the reduce dtype
// -> widened times w, with q = 1 and w = 1 (FP8: q = fp8_max / amax of the bucket, at most
// 2^126, and w = 1 / q; dist::reduce_scales).
// The expectation is computed with the CPU backend's casts, which are bit-identical to the
// GPU's (tests/gpu/test_gpu_ops.cpp), so the reduced gradients must match exactly for every
// reduce dtype, with and without accumulate_fp32, ZeRO-0 and ZeRO-1; also for FP8 buckets of
// gradients around 1e-38, where the cap on q binds (without it q is +inf and the zeros of the
// padding become NaN).
//
// Every wait is bounded (60 s); a timeout throws core::Error (the lone process's NcclJob has
// no on_timeout), which fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/fp8_scaling.h"
#include "dist/bucketed_grad_sync.h"
#include "dist/data_parallel.h"
#include "dist/nccl/nccl_communicator.h"
#include "tests/dist/sync_case.h"
#include "train/parameters.h"

#ifdef MANTISSA_TEST_CUDA
#include "core/ops/cuda/cuda_backend.h"
#endif

namespace mantissa::dist {
namespace {

using core::Backend;
using core::DType;
using core::Shape;
using core::Tensor;
using testing::describe;
using testing::finish_saw_nonfinite;
using testing::make_sync_store;
using testing::sync_config;
using testing::SyncCase;

constexpr double kTimeout = 60.0;

// NCCL reduces FP8 on sm_90 and newer only.
bool fp8_reductions(Backend& gpu) {
#ifdef MANTISSA_TEST_CUDA
  return dynamic_cast<core::CudaBackend&>(gpu).compute_capability() >= 90;
#else
  (void)gpu;
  return false;
#endif
}

std::string text(DType dtype, int64_t n) {
  std::ostringstream out;
  out << core::dtype_name(dtype) << " x " << n;
  return out.str();
}

// The lone process of a job of one: nothing to share, timeouts throw.
NcclJob lone_process() {
  NcclJob job;
  job.rank = 0;
  job.size = 1;
  return job;
}

class GpuNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
    cpu = core::make_cpu_backend();
    gpu = core::make_cuda_backend(0);
  }

  Tensor to_host(const Tensor& t) {
    Tensor host = Tensor::empty(t.shape(), t.dtype());
    gpu->copy(t, host);
    gpu->synchronize();
    return host;
  }

  // Random values rounded into `dtype` on the host: the reference. Magnitudes span 2^-8..2^7,
  // inside every dtype's normal range.
  Tensor reference(DType dtype, int64_t n, uint64_t seed) {
    Tensor f32 = Tensor::empty(Shape{n}, DType::kF32);
    float* x = f32.data_as<float>();
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = core::random_u32(seed, static_cast<uint64_t>(i));
      const float mantissa = 1.0f + static_cast<float>(bits & 0xFFFF) / 65536.0f;
      const int exponent = static_cast<int>((bits >> 16) % 16) - 8;
      x[i] = std::ldexp(mantissa, exponent) * ((bits >> 31) ? -1.0f : 1.0f);
    }
    if (dtype == DType::kF32) return f32;
    Tensor out = Tensor::empty(Shape{n}, dtype);
    cpu->cast(f32, out, core::CastParams{});
    return out;
  }

  // A device buffer whose every element is NaN (integers: -12345), written and waited for.
  // The caching allocator hands a freed block of the same size straight back, so a buffer
  // taken fresh may already hold the expected bytes (an earlier staging copy's): a collective
  // that wrote nothing into it, or read it before its input was written, would then pass.
  Tensor poisoned(const Shape& shape, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype, gpu->device());
    const bool integer = dtype == DType::kI32 || dtype == DType::kI64;
    gpu->fill(t, integer ? -12345.0f : std::nanf(""));
    gpu->synchronize();
    return t;
  }

  // `host`'s values in a poisoned device buffer, written there by a device-to-device copy
  // queued on the backend's stream right before the collective and not waited for: the
  // collective must be ordered after it (else it reads the poison).
  Tensor written_on_device(const Tensor& host) {
    Tensor staging = Tensor::empty(host.shape(), host.dtype(), gpu->device());
    gpu->copy(host, staging);
    gpu->synchronize();
    Tensor out = poisoned(host.shape(), host.dtype());
    gpu->copy(staging, out);
    return out;
  }

  void expect_bits(const Tensor& expected, const Tensor& on_device, const std::string& what) {
    const Tensor got = to_host(on_device);
    ASSERT_EQ(got.nbytes(), expected.nbytes()) << what;
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.nbytes()), 0) << what;
  }

  std::unique_ptr<Backend> cpu, gpu;
};

TEST_F(GpuNccl, EveryCollectiveAndDtypeAtSizeOne) {
  auto comm = make_nccl_communicator(lone_process(), *gpu, kTimeout);
  ASSERT_EQ(comm->rank(), 0);
  ASSERT_EQ(comm->size(), 1);
  EXPECT_TRUE(comm->device() == gpu->device());
  std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  if (fp8_reductions(*gpu)) {
    dtypes.push_back(DType::kE4M3);
    dtypes.push_back(DType::kE5M2);
  }
  // Odd sizes (not multiples of NCCL's or our vector widths) and one of several MiB.
  for (const int64_t n : {int64_t{1}, int64_t{1001}, int64_t{(1 << 21) + 3}}) {
    for (const DType dtype : dtypes) {
      const std::string what = text(dtype, n);
      const Tensor expected = reference(dtype, n, 17 + static_cast<uint64_t>(n));
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        Tensor buf = written_on_device(expected);
        comm->all_reduce(buf, op)->wait();
        expect_bits(expected, buf, "all_reduce " + what);
      }
      const std::vector<int64_t> counts = {n};
      {
        Tensor send = written_on_device(expected);
        Tensor recv = poisoned(Shape{n}, dtype);
        comm->reduce_scatter(send, recv, counts, ReduceOp::kSum)->wait();
        expect_bits(expected, recv, "reduce_scatter " + what);
      }
      {
        Tensor send = written_on_device(expected);
        Tensor recv = poisoned(Shape{n}, dtype);
        comm->all_gather(send, recv, counts)->wait();
        expect_bits(expected, recv, "all_gather " + what);
        Tensor in_place = written_on_device(expected);
        comm->all_gather(in_place, in_place, counts)->wait();
        expect_bits(expected, in_place, "all_gather in place " + what);
      }
      {
        Tensor buf = written_on_device(expected);
        comm->broadcast(buf, 0)->wait();
        expect_bits(expected, buf, "broadcast " + what);
      }
      {
        Tensor send = written_on_device(expected);
        Tensor recv = poisoned(Shape{n}, dtype);
        comm->all_to_all(send, counts, recv, counts)->wait();
        expect_bits(expected, recv, "all_to_all " + what);
      }
    }
  }
  // Integers: MAX (the consistency check's and the stop flag's reduction) and a gather.
  for (const DType dtype : {DType::kI32, DType::kI64}) {
    Tensor host = Tensor::empty(Shape{37}, dtype);
    for (int64_t i = 0; i < 37; ++i) {
      if (dtype == DType::kI32) {
        host.data_as<int32_t>()[i] = static_cast<int32_t>(i * 7919 - 100000);
      } else {
        host.data_as<int64_t>()[i] = (int64_t{1} << 40) * i - 3;
      }
    }
    Tensor buf = written_on_device(host);
    comm->all_reduce(buf, ReduceOp::kMax)->wait();
    expect_bits(host, buf, std::string("all_reduce max ") + core::dtype_name(dtype));
  }
  comm->barrier();
}

TEST_F(GpuNccl, DuplicatesCompleteWhateverOrderTheyAreWaitedIn) {
  auto comm = make_nccl_communicator(lone_process(), *gpu, kTimeout);
  auto a = comm->duplicate();
  auto b = a->duplicate();
  const Tensor expected = reference(DType::kBF16, 4099, 3);
  Tensor x = written_on_device(expected);
  Tensor y = written_on_device(expected);
  // Two requests in flight at once, on different communicators, completed out of order.
  RequestPtr rx = a->all_reduce(x, ReduceOp::kSum);
  RequestPtr ry = b->all_reduce(y, ReduceOp::kSum);
  ry->wait();
  rx->wait();
  EXPECT_TRUE(rx->test());
  expect_bits(expected, x, "first duplicate");
  expect_bits(expected, y, "second duplicate");
  comm->barrier();
}

TEST_F(GpuNccl, RejectsHostBuffersAndBadCounts) {
  auto comm = make_nccl_communicator(lone_process(), *gpu, kTimeout);
  Tensor host = Tensor::empty(Shape{8}, DType::kF32);
  EXPECT_THROW(comm->all_reduce(host, ReduceOp::kSum), core::Error);
  Tensor dev = Tensor::empty(Shape{8}, DType::kF32, gpu->device());
  Tensor recv = Tensor::empty(Shape{8}, DType::kF32, gpu->device());
  EXPECT_THROW(comm->reduce_scatter(dev, recv, {7}, ReduceOp::kSum), core::Error);
  EXPECT_THROW(make_nccl_communicator(lone_process(), *cpu, kTimeout), core::Error);
}

// ---------------------------------------------------------------------------------------
// Gradient sync

// Gradients as backward leaves them (zero in the padding): magnitudes 2^-12 .. 2^2, both
// signs, so BF16/FP16 round most of them and FP8 flushes the smallest.
// Magnitudes 2^(shift - 13) .. 2^(shift + 2), both signs (FP32 subnormals below 2^-126).
std::vector<float> gradients(const train::ParameterStore& params, int shift = 0) {
  std::vector<float> g(static_cast<size_t>(params.flat_numel()), 0.0f);
  for (const train::Parameter& p : params.all()) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      const uint32_t bits = core::random_u32(11, static_cast<uint64_t>(p.offset + i));
      const float mantissa = 0.5f + static_cast<float>(bits & 0xFFFF) / 131072.0f;
      const int exponent = static_cast<int>((bits >> 16) % 15) - 12;
      g[static_cast<size_t>(p.offset + i)] =
          std::ldexp(mantissa, exponent + shift) * ((bits >> 31) ? -1.0f : 1.0f);
    }
  }
  return g;
}

// Every gradient-sync case over NCCL (6 buckets over make_sync_store's parameters).
DistConfig dist_config(const SyncCase& c) {
  DistConfig d;
  d.backend = CommBackend::kNCCL;
  d.timeout_s = kTimeout;
  return sync_config(c, d);
}

class GpuGradSync : public GpuNccl {
 protected:
  std::unique_ptr<DataParallel> data_parallel(train::ParameterStore& params, const SyncCase& c) {
    return DataParallel::create(*gpu, params, dist_config(c),
                                make_nccl_communicator(lone_process(), *gpu, kTimeout));
  }

  // What one rank's sync must leave in bucket [begin, end): the cast round trip of the
  // gradients with DataParallel's scales, by the CPU backend.
  void expected_bucket(const SyncCase& c, std::vector<float>& g, int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    Tensor grads = Tensor::wrap(g.data() + begin, Shape{n}, DType::kF32);
    if (c.dtype == DType::kF32) return;  // q = w = 1 in FP32: exact
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(grads.data_as<float>()[i]));
    // The scales as DataParallel computes them.
    const ReduceScales scales = reduce_scales(c.dtype, 1, amax);
    float q32 = scales.q, w32 = scales.w;
    Tensor q_t = Tensor::wrap(&q32, Shape{1}, DType::kF32);
    Tensor w_t = Tensor::wrap(&w32, Shape{1}, DType::kF32);
    Tensor low = Tensor::empty(Shape{n}, c.dtype);
    core::CastParams narrow, widen;
    narrow.scale = &q_t;
    widen.scale = &w_t;
    cpu->cast(grads, low, narrow);
    cpu->cast(low, grads, widen);
  }

  // One sync of gradients(params, shift) must leave, bit for bit, the CPU's cast round trip of
  // every bucket, and only finite values.
  void expect_round_trip(const SyncCase& c, int shift = 0) {
    train::ParameterStore params = make_sync_store(*gpu);
    auto dp = data_parallel(params, c);
    auto optimizer = dp->make_optimizer(core::AdamWConfig{});
    std::vector<float> g = gradients(params, shift);
    Tensor host = Tensor::wrap(g.data(), Shape{params.flat_numel()}, DType::kF32);
    gpu->copy(host, params.grads());
    // Backward reports parameters last to first.
    for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
    EXPECT_FALSE(finish_saw_nonfinite(*dp, *gpu, params.grads())) << describe(c);
    const Tensor got = to_host(params.grads());

    for (const auto& [begin, end] : dp->buckets()) expected_bucket(c, g, begin, end);
    const float* r = got.data_as<float>();
    int64_t bad = 0;
    for (int64_t i = optimizer->owned_begin(); i < optimizer->owned_end(); ++i) {
      const float e = g[static_cast<size_t>(i)];
      if ((!std::isfinite(r[i]) || std::memcmp(&e, &r[i], sizeof e) != 0) && ++bad <= 5) {
        ADD_FAILURE() << describe(c) << " (gradients times 2^" << shift << "): element " << i
                      << " is " << r[i] << ", expected " << e;
      }
    }
    EXPECT_EQ(bad, 0) << describe(c);
    EXPECT_EQ(optimizer->owned_begin(), 0) << describe(c);
    EXPECT_EQ(optimizer->owned_end(), params.flat_numel()) << describe(c);
  }
};

TEST_F(GpuGradSync, EveryReduceDtypeIsTheCastRoundTrip) {
  std::vector<SyncCase> cases;
  for (const DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
    // FP8 buckets are reduced in FP8 by NCCL (sm_90); accumulate_fp32 sends them point to
    // point instead (all_to_all, all_gather), which every GPU supports.
    const bool fp8_sum = !core::is_fp8(d) || fp8_reductions(*gpu);
    for (const int zero : {0, 1}) {
      if (fp8_sum) cases.push_back({d, false, zero});
      cases.push_back({d, true, zero});
    }
  }
  for (const SyncCase& c : cases) expect_round_trip(c);
}

// Gradients of 2^-139 .. 2^-124 (about 1e-38): fp8_max / amax exceeds FP32's range, and q is
// capped at 2^126 (dist::reduce_scales).
TEST_F(GpuGradSync, Fp8BucketsOfTinyGradientsStayFinite) {
  for (const DType d : {DType::kE4M3, DType::kE5M2}) {
    for (const int zero : {0, 1}) {
      if (fp8_reductions(*gpu)) expect_round_trip({d, false, zero}, -126);
      expect_round_trip({d, true, zero}, -126);
    }
  }
}

// Every reduced dtype but F32: one rank alone in FP32 reduces nothing and casts nothing, and
// leaves the check to the training step's own (BucketedGradSync::alone_in_fp32).
TEST_F(GpuGradSync, NonFiniteGradientsRaiseTheFlagBeforeTheCast) {
  for (const DType d : {DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
    const SyncCase c{d, core::is_fp8(d) && !fp8_reductions(*gpu), 0};
    train::ParameterStore params = make_sync_store(*gpu);
    auto dp = data_parallel(params, c);
    std::vector<float> g = gradients(params);
    Tensor host = Tensor::wrap(g.data(), Shape{params.flat_numel()}, DType::kF32);
    float& planted = g[static_cast<size_t>(params[4].offset + 5)];  // one element of one bucket
    const float clean = planted;
    // One step per non-finite value, each followed by a clean step: the flag is raised
    // before the cast (a saturating FP8 cast would turn the inf into a finite value), and
    // does not stick.
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
      planted = bad;
      gpu->copy(host, params.grads());
      for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
      EXPECT_TRUE(finish_saw_nonfinite(*dp, *gpu, params.grads()))
          << describe(c) << " with " << bad;
      planted = clean;
      gpu->copy(host, params.grads());
      for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
      EXPECT_FALSE(finish_saw_nonfinite(*dp, *gpu, params.grads()))
          << describe(c) << " after " << bad;
    }
  }
}

TEST_F(GpuGradSync, ScalarCollectivesAndZeroOneOptimizer) {
  train::ParameterStore zero0_params = make_sync_store(*gpu);
  train::ParameterStore zero1_params = make_sync_store(*gpu);
  auto zero0 = data_parallel(zero0_params, {DType::kBF16, false, 0});
  auto zero1 = data_parallel(zero1_params, {DType::kBF16, false, 1});

  EXPECT_EQ(zero0->sum_across_ranks(2.5), 2.5);
  std::vector<float> values = {1.0f, NAN, -3.0f};
  zero0->max_across_ranks(values);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], INFINITY);  // NaN travels as +inf, so that MAX cannot drop it
  EXPECT_EQ(values[2], -3.0f);
  zero0->broadcast_parameters();
  EXPECT_NO_THROW(zero0->check_consistency({}));

  // One AdamW step: ZeRO-1's shard is the whole buffer at size 1, and its all-gather of the
  // compute copy (in place) must leave exactly what the local optimizer computes.
  core::AdamWConfig adamw;
  adamw.weight_decay = 0.1f;
  auto local = zero0->make_optimizer(adamw);
  auto sharded = zero1->make_optimizer(adamw);
  std::vector<float> g = gradients(zero0_params);
  Tensor host = Tensor::wrap(g.data(), Shape{zero0_params.flat_numel()}, DType::kF32);
  gpu->copy(host, zero0_params.grads());
  gpu->copy(host, zero1_params.grads());
  local->step(zero0_params, 1e-3f, 1.0f);
  sharded->step(zero1_params, 1e-3f, 1.0f);
  const Tensor m0 = to_host(zero0_params.masters()), m1 = to_host(zero1_params.masters());
  const Tensor c0 = to_host(zero0_params.compute()), c1 = to_host(zero1_params.compute());
  EXPECT_EQ(std::memcmp(m0.data(), m1.data(), m0.nbytes()), 0);
  EXPECT_EQ(std::memcmp(c0.data(), c1.data(), c0.nbytes()), 0);
  EXPECT_NO_THROW(zero1->check_consistency({}));
}

}  // namespace
}  // namespace mantissa::dist
