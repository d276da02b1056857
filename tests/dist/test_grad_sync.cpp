// DataParallel as a GradientSync, on a parameter store of odd-sized parameters split into
// many small buckets, for every reduce dtype, with and without accumulate_fp32, ZeRO-0 and
// ZeRO-1, overlapped and not: the reduced gradients against the FP64 mean over ranks.
//
// Error bounds (u: unit roundoff of the reduce dtype, s: half its smallest subnormal, both in
// units of the pre-scaled codes c = q g, where q = 1/N, or for FP8 fp8_max / (N amax) capped at
// 2^(126 - ceil(log2 N))):
//   every input is rounded once (the cast) and the sum at most N - 1 more times (one per hop,
//   or once for accumulate_fp32), so
//   |reduced - mean| <= (gamma(2N - 1) * sum_r |c_r| + (2N - 1) s) / (N q).
// The RMS errors of the plain and accumulate_fp32 paths are printed side by side. The same
// bound holds for FP8 buckets of gradients around 1e-38, where the cap on q binds.
//
// Also here: the non-finite flag is raised before the cast (a saturating FP8 cast would hide
// the inf from the sum), scalar collectives, the start-up broadcast, the consistency check
// (which must catch a perturbed master, naming the rank; under ZeRO-1 a perturbed compute
// copy), and the start-up "broadcast" under ZeRO-1, an all-gather of sharded masters. The
// memory of ZeRO-1 is tested in test_zero1_memory.cpp (on 1, 2 and 4 ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/precision/fp8_scaling.h"
#include "dist/data_parallel.h"
#include "tests/dist/dist_test.h"
#include "tests/dist/sync_case.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using testing::describe;
using testing::finish_saw_nonfinite;
using testing::make_sync_store;
using testing::sync_config;
using testing::SyncCase;

// How the consistency check names a rank's value: "rank R (host H) has".
std::string rank_has(int rank) {
  std::ostringstream out;
  out << "rank " << rank << " (host " << testing::world().host_of(rank) << ") has";
  return out.str();
}

// Rank r's gradient element i: magnitudes spread over 2^-12 .. 2^2, both signs.
double gradient(int rank, int64_t i) {
  const uint32_t bits =
      core::random_u32(static_cast<uint64_t>(rank) + 11, static_cast<uint64_t>(i));
  const double mantissa = 0.5 + (bits & 0xFFFF) / 131072.0;
  const int exponent = static_cast<int>((bits >> 16) % 15) - 12;
  return std::ldexp(mantissa, exponent) * ((bits >> 31) ? -1.0 : 1.0);
}

// The gradient as the store holds it, times 2^shift: rounded to FP32 (exact for shift 0; below
// 2^-126 FP32 subnormals keep fewer bits), so that the FP64 reference sums what is reduced.
double input(int rank, int64_t i, int shift) {
  return static_cast<float>(std::ldexp(gradient(rank, i), shift));
}

// Gradients as backward leaves them: zero in the padding.
void fill_gradients(train::ParameterStore& params, int rank, int shift = 0) {
  float* g = params.grads().data_as<float>();
  std::fill(g, g + params.flat_numel(), 0.0f);
  for (const train::Parameter& p : params.all()) {
    for (int64_t i = 0; i < p.numel(); ++i)
      g[p.offset + i] = static_cast<float>(input(rank, p.offset + i, shift));
  }
}

// The FP8 pre-scale q = fp8_max / (N amax), rounded to FP32, but at most 2^(126 - ceil(log2 N)),
// the power of two that keeps q and the widening scale 1 / (N q) normal FP32 numbers.
double fp8_prescale(DType dtype, int n, double amax) {
  int log2_n = 0;
  while ((1 << log2_n) < n) ++log2_n;
  const double q = static_cast<float>(core::fp8_max(dtype) / (n * amax));
  return std::min(q, std::ldexp(1.0, 126 - log2_n));
}

class GradSync : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = core::make_cpu_backend();
    n = testing::world().size();
    me = testing::world().rank();
  }

  DistConfig config(const SyncCase& c) const {
    DistConfig d;
    d.backend = CommBackend::kMPI;
    d.timeout_s = 60;
    return sync_config(c, d);
  }

  // Runs one reduction of the gradients times 2^shift; returns the RMS error (relative to the
  // RMS of the mean) on the range this rank owns, after checking every element against its
  // bound and the RMS error against what the roundings give.
  double reduce_and_check(const SyncCase& c, int shift = 0) {
    train::ParameterStore params = make_sync_store(*backend);
    auto dp = DataParallel::create(testing::world(), *backend, params, config(c));
    auto optimizer = dp->make_optimizer(core::AdamWConfig{});
    fill_gradients(params, me, shift);
    // Backward reports parameters last to first.
    for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
    EXPECT_FALSE(finish_saw_nonfinite(*dp, *backend, params.grads())) << describe(c);

    const float* g = params.grads().data_as<float>();
    const double u = testing::unit_roundoff(c.dtype), s = testing::half_min_subnormal(c.dtype);
    const double k = 2.0 * n - 1.0;
    const double gamma = k * u / (1.0 - k * u);
    double err2 = 0.0, ref2 = 0.0;
    int bad = 0;
    int64_t checked = 0;
    const auto buckets = dp->buckets();
    // The buckets tile the flat buffer (in some order), so that the loop below reaches every
    // element this rank owns.
    auto tiles = buckets;
    std::sort(tiles.begin(), tiles.end());
    int64_t next = 0;
    for (const auto& [bucket_begin, bucket_end] : tiles) {
      EXPECT_EQ(bucket_begin, next) << describe(c) << ": the buckets leave a gap or overlap";
      next = bucket_end;
    }
    EXPECT_EQ(next, params.flat_numel()) << describe(c);
    for (const auto& [bucket_begin, bucket_end] : buckets) {
      // The shared FP8 scale of this bucket: amax over ranks and elements.
      double amax = 0.0;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = bucket_begin; i < bucket_end; ++i) {
          if (params.find_by_flat_index(i) >= 0) {
            amax = std::max(amax, std::fabs(input(r, i, shift)));
          }
        }
      }
      const double q = core::is_fp8(c.dtype) ? fp8_prescale(c.dtype, n, amax) : 1.0 / n;
      const int64_t lo = std::max(bucket_begin, optimizer->owned_begin());
      const int64_t hi = std::min(bucket_end, optimizer->owned_end());
      for (int64_t i = lo; i < hi; ++i) {
        ++checked;
        if (params.find_by_flat_index(i) < 0) {
          EXPECT_EQ(g[i], 0.0f) << "padding element " << i << " changed";
          continue;
        }
        double mean = 0.0, magnitude = 0.0;
        for (int r = 0; r < n; ++r) {
          mean += input(r, i, shift) / n;
          magnitude += std::fabs(input(r, i, shift) * q);
        }
        const double bound = (gamma * magnitude + k * s) / (n * q);
        const double err = g[i] - mean;
        err2 += err * err;
        ref2 += mean * mean;
        if (!(std::fabs(err) <= bound) && ++bad <= 3) {  // NaN fails too
          ADD_FAILURE() << describe(c) << ": element " << i << " = " << g[i] << ", FP64 mean "
                        << mean << ", bound " << bound;
        }
      }
    }
    EXPECT_EQ(bad, 0) << describe(c);
    EXPECT_GT(optimizer->owned_end(), optimizer->owned_begin()) << describe(c);
    EXPECT_EQ(checked, optimizer->owned_end() - optimizer->owned_begin()) << describe(c);
    // The per-element bound is the worst case of 2n - 1 roundings (for FP8 on 4 ranks several
    // times the mean); over thousands of elements the RMS error is that of 2n - 1 independent
    // roundings of relative size up to u, about sqrt((2n - 1) / 3) u (measured: 0.5 to 0.7 u on
    // 2 and 4 ranks). A rank lost, or a wrong divisor, is off by a good part of the mean.
    const double rms = std::sqrt(err2 / ref2);
    EXPECT_LE(rms, std::sqrt(k / 3.0) * u) << describe(c) << ": RMS relative error";
    return rms;
  }

  std::unique_ptr<core::Backend> backend;
  int n = 1, me = 0;
};

TEST_F(GradSync, EveryDtypeAndModeMatchesTheFp64Mean) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2};
  for (DType d : dtypes) {
    double rms[2][2];  // [zero_stage][accumulate]
    for (int zero : {0, 1}) {
      for (bool accumulate : {false, true}) {
        rms[zero][accumulate] = reduce_and_check({d, accumulate, zero, true});
      }
    }
    if (me == 0) {
      std::printf(
          "%d ranks, %-8s RMS relative error: plain %.3e, accumulate_fp32 %.3e "
          "(ZeRO-1: %.3e, %.3e)\n",
          n, reduce_dtype_name(d), rms[0][0], rms[0][1], rms[1][0], rms[1][1]);
    }
  }
}

// Buckets whose amax is tiny but not zero: gradients of 2^-138 .. 2^-124 (about 1e-38), where
// fp8_max / (N amax) exceeds FP32's range. The pre-scale is then clamped to
// 2^(126 - ceil(log2 N)) (fp8_prescale), so every result is finite: a pre-scale of +inf made
// the zeros of the padding 0 * inf = NaN, and a NaN average, which the non-finite check (the
// finite amax) did not see. The bound is the one above at the clamped q: a gradient whose code
// |q g| is below half the smallest FP8 subnormal (|g| < s / q: 2^-10 / q for E4M3, 2^-17 / q
// for E5M2) rounds to 0, within the (2N - 1) s / (N q) term.
TEST_F(GradSync, Fp8BucketsOfTinyGradientsStayFinite) {
  for (DType d : {DType::kE4M3, DType::kE5M2}) {
    double rms[2][2];  // [zero_stage][accumulate]
    for (int zero : {0, 1}) {
      for (bool accumulate : {false, true}) {
        rms[zero][accumulate] = reduce_and_check({d, accumulate, zero, true}, -126);
      }
    }
    if (me == 0) {
      std::printf(
          "%d ranks, %-8s RMS relative error of gradients ~1e-38: plain %.3e, accumulate_fp32 "
          "%.3e (ZeRO-1: %.3e, %.3e)\n",
          n, reduce_dtype_name(d), rms[0][0], rms[0][1], rms[1][0], rms[1][1]);
    }
  }
}

// A job of one rank (run by dist_grad_sync_np1 alone) has nothing to reduce: whatever the
// reduce dtype, accumulate_fp32 and ZeRO stage, its gradients stay as backward left them, bit
// for bit. They went through the reduce dtype and back (BF16 by default) and were rounded.
TEST_F(GradSync, ASingleRankKeepsItsGradientsExactly) {
  ASSERT_EQ(n, 1) << "run on one rank";
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2};
  for (DType d : dtypes) {
    for (int zero : {0, 1}) {
      for (bool accumulate : {false, true}) {
        const SyncCase c{d, accumulate, zero, true};
        train::ParameterStore params = make_sync_store(*backend);
        auto dp = DataParallel::create(testing::world(), *backend, params, config(c));
        fill_gradients(params, me);
        const float* g = params.grads().data_as<float>();
        const std::vector<float> before(g, g + params.flat_numel());
        for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
        EXPECT_FALSE(finish_saw_nonfinite(*dp, *backend, params.grads())) << describe(c);
        EXPECT_EQ(std::memcmp(before.data(), g, before.size() * sizeof(float)), 0)
            << describe(c) << ": the gradients changed";
        // A job of one rank reduces in FP32 (create over a World sees to it): nothing to send.
        EXPECT_EQ(dp->last_step_comm_bytes(), 0) << describe(c);
      }
    }
  }
}

TEST_F(GradSync, OverlapChangesNoBitAndEveryRankGetsTheSameBits) {
  for (DType d : {DType::kBF16, DType::kE4M3}) {
    std::vector<float> results[2];
    for (bool overlap : {false, true}) {
      train::ParameterStore params = make_sync_store(*backend);
      auto dp =
          DataParallel::create(testing::world(), *backend, params, config({d, false, 0, overlap}));
      fill_gradients(params, me);
      // Out of order and with one parameter never reported: finish() must cope.
      for (int i : {7, 6, 4, 5, 2, 3, 1}) dp->grad_ready(i);
      finish_saw_nonfinite(*dp, *backend, params.grads());
      const float* g = params.grads().data_as<float>();
      results[overlap].assign(g, g + params.flat_numel());
      // Same bits everywhere: every rank's copy equals rank 0's.
      Tensor copy = Tensor::empty(Shape{params.flat_numel()}, DType::kF32);
      std::memcpy(copy.data(), g, copy.nbytes());
      dp->communicator().broadcast(copy, 0)->wait();
      EXPECT_EQ(std::memcmp(copy.data(), g, copy.nbytes()), 0) << reduce_dtype_name(d);
    }
    EXPECT_EQ(results[0], results[1]) << reduce_dtype_name(d);
  }
}

TEST_F(GradSync, OverlapStartsABucketAsSoonAsItsParametersAreReady) {
  for (bool overlap : {false, true}) {
    train::ParameterStore params = make_sync_store(*backend);
    auto dp = DataParallel::create(testing::world(), *backend, params,
                                   config({DType::kBF16, false, 0, overlap}));
    fill_gradients(params, me);
    // The first bucket holds the last parameters; report exactly those.
    const int64_t first_bucket_begin = dp->buckets().front().first;
    for (int i = params.size() - 1; i >= 0 && params[i].offset >= first_bucket_begin; --i) {
      dp->grad_ready(i);
    }
    // Bytes are counted when a collective is posted: before finish() only with overlap.
    EXPECT_EQ(dp->last_step_comm_bytes() > 0, overlap) << (overlap ? "overlap" : "no overlap");
    finish_saw_nonfinite(*dp, *backend, params.grads());
  }
}

TEST_F(GradSync, NonFiniteIsFlaggedBeforeTheCastOnlyWhereItHappened) {
  const int culprit = n - 1;
  for (DType d : {DType::kF32, DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    for (int zero : {0, 1}) {
      for (float bad : {INFINITY, NAN}) {
        train::ParameterStore params = make_sync_store(*backend);
        auto dp = DataParallel::create(testing::world(), *backend, params,
                                       config({d, false, zero, true}));
        fill_gradients(params, me);
        const int64_t where = params[3].offset + 100;
        if (me == culprit) params.grads().data_as<float>()[where] = bad;
        for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
        const bool flagged = finish_saw_nonfinite(*dp, *backend, params.grads());
        EXPECT_EQ(flagged, me == culprit) << reduce_dtype_name(d) << " zero" << zero << " " << bad;
        std::vector<float> flag{flagged ? 1.0f : 0.0f};
        dp->max_across_ranks(flag);
        EXPECT_EQ(flag[0], 1.0f);
        if (core::is_fp8(d) && zero == 0 && std::isinf(bad)) {
          // The saturating cast turned the inf into a finite sum: without the flag, nobody
          // would know.
          EXPECT_TRUE(std::isfinite(params.grads().data_as<float>()[where]))
              << reduce_dtype_name(d) << ": expected a saturated, finite sum";
        }
      }
    }
  }
}

// A step with inf or NaN in one rank's gradients is skipped, yet every rank must still hold
// the same bits: FP8 reduction derives its scales from the MAX-reduced amax, and a float MAX
// may drop one rank's NaN (Open MPI keeps it from rank 0 and drops it from the last rank);
// were the result to differ between ranks, so would their scales and sums.
TEST_F(GradSync, ANonFiniteStepStillGivesEveryRankTheSameBits) {
  for (DType d : {DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    for (float bad : {INFINITY, NAN}) {
      for (int culprit : {0, n - 1}) {
        train::ParameterStore params = make_sync_store(*backend);
        auto dp =
            DataParallel::create(testing::world(), *backend, params, config({d, false, 0, true}));
        fill_gradients(params, me);
        if (me == culprit) params.grads().data_as<float>()[params[3].offset + 100] = bad;
        for (int i = params.size() - 1; i >= 0; --i) dp->grad_ready(i);
        finish_saw_nonfinite(*dp, *backend, params.grads());
        const float* g = params.grads().data_as<float>();
        Tensor copy = Tensor::empty(Shape{params.flat_numel()}, DType::kF32);
        std::memcpy(copy.data(), g, copy.nbytes());
        dp->communicator().broadcast(copy, 0)->wait();
        EXPECT_EQ(std::memcmp(copy.data(), g, copy.nbytes()), 0)
            << reduce_dtype_name(d) << " " << bad << " on rank " << culprit;
      }
    }
  }
}

TEST_F(GradSync, ScalarCollectivesAgreeBitForBit) {
  train::ParameterStore params = make_sync_store(*backend);
  auto dp = DataParallel::create(testing::world(), *backend, params,
                                 config({DType::kBF16, false, 0, true}));
  // 0.1 * (r + 1): a sum whose rounding depends on the order of additions.
  const double sum = dp->sum_across_ranks(0.1 * (me + 1));
  double expected = 0.0;
  for (int r = 0; r < n; ++r) expected += 0.1 * (r + 1);
  EXPECT_EQ(sum, expected);
  std::vector<float> values{static_cast<float>(me), -static_cast<float>(me), me == 0 ? NAN : 1.0f};
  dp->max_across_ranks(values);
  EXPECT_EQ(values[0], static_cast<float>(n - 1));
  EXPECT_EQ(values[1], 0.0f);
  EXPECT_TRUE(std::isinf(values[2])) << "a NaN must survive a MAX reduction (as inf)";
}

TEST_F(GradSync, BroadcastParametersCopiesRankZero) {
  train::ParameterStore params = make_sync_store(*backend);
  auto dp = DataParallel::create(testing::world(), *backend, params,
                                 config({DType::kBF16, false, 0, true}));
  float* masters = params.masters().data_as<float>();
  const float original = masters[5];
  masters[5] = static_cast<float>(me) + 100.0f;
  dp->broadcast_parameters();
  EXPECT_EQ(masters[5], 100.0f);
  EXPECT_EQ(params.compute().data_as<float>()[5], 100.0f) << "compute copy not refreshed";
  EXPECT_NE(original, 100.0f);
}

TEST_F(GradSync, BroadcastParametersUnderZero1GathersTheShards) {
  train::ParameterStore reference = make_sync_store(*backend);
  train::ParameterStore params = make_sync_store(*backend);
  auto dp = DataParallel::create(testing::world(), *backend, params,
                                 config({DType::kBF16, false, 1, true}));
  auto optimizer = dp->make_optimizer(core::AdamWConfig{});
  const int64_t begin = optimizer->owned_begin();
  const int64_t shard = optimizer->owned_end() - begin;
  ASSERT_EQ(params.masters_begin(), begin);
  ASSERT_EQ(params.masters().numel(), shard) << "the store must keep only this rank's shard";
  EXPECT_EQ(std::memcmp(params.masters().data(), reference.masters().data_as<float>() + begin,
                        static_cast<size_t>(shard) * 4),
            0);
  // Only this rank's shard can come back from its own masters: the rest must be gathered.
  backend->fill(params.compute(), 0.0f);
  dp->broadcast_parameters();
  EXPECT_EQ(std::memcmp(params.compute().data(), reference.compute().data(),
                        reference.compute().nbytes()),
            0)
      << "the compute copy is not the whole model on rank " << me;
}

TEST_F(GradSync, ConsistencyCheckUnderZero1CoversTheComputeCopy) {
  train::ParameterStore params = make_sync_store(*backend);
  auto dp = DataParallel::create(testing::world(), *backend, params,
                                 config({DType::kBF16, false, 1, true}));
  ReplicaState state;
  state.step = 3;
  dp->check_consistency(state);
  // One ulp in the compute copy of the last rank, outside its own shard of the masters.
  const int culprit = n - 1;
  float* compute = params.compute().data_as<float>();
  const int64_t where = params[0].offset + 1;
  if (me == culprit) compute[where] = std::nextafter(compute[where], 1.0f);
  try {
    dp->check_consistency(state);
    ADD_FAILURE() << "the consistency check missed a perturbed compute copy";
  } catch (const core::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("checksum of the compute copy: " + rank_has(0)), std::string::npos)
        << message;
    EXPECT_NE(message.find(rank_has(culprit)), std::string::npos) << message;
  }
}

TEST_F(GradSync, ConsistencyCheckNamesTheRankAndTheField) {
  train::ParameterStore params = make_sync_store(*backend);
  auto dp = DataParallel::create(testing::world(), *backend, params,
                                 config({DType::kBF16, false, 0, true}));
  ReplicaState state;
  state.step = 12;
  state.scaler.scale = 1024.0f;
  state.fp8_scales = {1.0f, 2.0f};
  dp->check_consistency(state);  // identical replicas pass

  const auto expect_failure = [&](const ReplicaState& s, const std::string& field,
                                  const std::string& rank) {
    try {
      dp->check_consistency(s);
      ADD_FAILURE() << "the consistency check missed a difference in " << field;
    } catch (const core::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(field), std::string::npos) << message;
      EXPECT_NE(message.find(rank), std::string::npos) << message;
    }
  };

  // One ulp on one master of the last rank.
  const int culprit = n - 1;
  float* masters = params.masters().data_as<float>();
  const float saved = masters[params[4].offset];
  if (me == culprit) masters[params[4].offset] = std::nextafter(saved, 1.0f);
  expect_failure(state, "checksum of the FP32 masters", rank_has(culprit));
  masters[params[4].offset] = saved;
  dp->check_consistency(state);

  ReplicaState scaler = state;
  if (me == 1) scaler.scaler.growth_tracker = 3;
  expect_failure(scaler, "loss-scaler growth_tracker", rank_has(1) + " 3");

  ReplicaState fp8 = state;
  if (me == 0) fp8.fp8_scales[1] = 4.0f;
  expect_failure(fp8, "checksum of the FP8 scales", rank_has(1));
}

// dist::validate's messages, as create() reports them: "dist.<field> = <value>: <rule>", the
// config layer's words (a bad value reads the same from `mantissa train` and from create()).
TEST_F(GradSync, BadConfigsNameTheField) {
  train::ParameterStore params = make_sync_store(*backend);
  const auto expect_config_error = [&](const DistConfig& bad, const std::string& expected) {
    try {
      DataParallel::create(testing::world(), *backend, params, bad);
      ADD_FAILURE() << "no error, expected: " << expected;
    } catch (const core::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
  };
  const DistConfig good = config({DType::kBF16, false, 0, true});
  DistConfig bad = good;
  bad.bucket_mb = 0;
  expect_config_error(bad, "dist.bucket_mb = 0: must lie in (0, 65536]");
  bad.bucket_mb = 65536.5;
  expect_config_error(bad, "dist.bucket_mb = 65536.5: must lie in (0, 65536]");
  expect_config_error(config({DType::kI32, false, 0, true}),
                      "dist.grad_reduce_dtype = i32: must be FP32, BF16, FP16, FP8_E4M3 or "
                      "FP8_E5M2");
  expect_config_error(config({DType::kBF16, false, 2, true}),
                      "dist.zero_stage = 2: must lie in [0, 1]");
  bad = good;
  bad.timeout_s = -1;
  expect_config_error(bad, "dist.timeout_s = -1: must be a finite number >= 1 (seconds)");
  bad = good;
  bad.consistency_check_every = -1;
  expect_config_error(bad, "dist.consistency_check_every = -1: must be >= 0");
  bad = good;
  bad.backend = static_cast<CommBackend>(7);
  expect_config_error(bad, "dist.backend = 7: must be AUTO, MPI or NCCL");
}

}  // namespace
}  // namespace mantissa::dist
