// ParameterStore with only a range of its masters (what a ZeRO-1 rank keeps): the range keeps
// its values and nothing else is held, refresh_compute_copy writes only that range of the
// compute copy, set_weights sets the range of the masters and the whole compute copy, and
// what needs all masters (LocalAdamW) refuses such a store.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace mantissa::train {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

ParameterStore make_store(core::Backend& backend) {
  ParameterStore params;
  params.add({"a", Shape{300}, Init::kNormal, 0.02f, true});
  params.add({"b", Shape{7}, Init::kOnes, 0.0f, false});
  params.add({"c", Shape{40, 10}, Init::kNormal, 1.0f, true});
  params.allocate(backend, DType::kBF16, 11);
  return params;
}

std::vector<char> bytes(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data());
  return {p, p + t.nbytes()};
}

// The message of the core::Error `body` throws ("" when it throws none).
template <class Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "";
}

class ParameterStoreShard : public ::testing::Test {
 protected:
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  ParameterStore reference = make_store(*backend);
  ParameterStore params = make_store(*backend);
  const int64_t begin = 128, end = 640;  // cuts through parameters a and c
};

TEST_F(ParameterStoreShard, KeepsOnlyTheRange) {
  ASSERT_TRUE(params.keeps_all_masters());
  params.keep_masters(*backend, begin, end);
  EXPECT_FALSE(params.keeps_all_masters());
  EXPECT_EQ(params.masters_begin(), begin);
  EXPECT_EQ(params.masters().numel(), end - begin);
  EXPECT_EQ(std::memcmp(params.masters().data(), reference.masters().data_as<float>() + begin,
                        params.masters().nbytes()),
            0);
  for (const Parameter& p : params.all()) EXPECT_FALSE(p.master.defined()) << p.spec.name;
  EXPECT_EQ(bytes(params.compute()), bytes(reference.compute()));

  EXPECT_NE(error_of([&] {
              params.keep_masters(*backend, 0, 128);
            }).find("already keeps only the masters [128, 640)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              reference.keep_masters(*backend, 600, 100000);
            }).find("[600, 100000) is not a range"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              LocalAdamW optimizer(*backend, params, core::AdamWConfig{});
            }).find("keeps only the masters [128, 640)"),
            std::string::npos);
}

TEST_F(ParameterStoreShard, RefreshWritesOnlyTheRangeOfTheComputeCopy) {
  params.keep_masters(*backend, begin, end);
  backend->fill(params.compute(), 0.0f);
  params.refresh_compute_copy(*backend);
  const std::vector<char> expected = bytes(reference.compute());
  const std::vector<char> got = bytes(params.compute());
  const size_t element = core::dtype_size(DType::kBF16);
  for (int64_t i = 0; i < params.flat_numel(); ++i) {
    const bool inside = i >= begin && i < end;
    const char* want = inside ? expected.data() + i * element : "\0\0";
    ASSERT_EQ(std::memcmp(got.data() + i * element, want, element), 0) << "element " << i;
  }
}

TEST_F(ParameterStoreShard, SetWeightsSetsTheRangeAndTheWholeComputeCopy) {
  params.keep_masters(*backend, begin, end);
  std::vector<float> weights(static_cast<size_t>(params.flat_numel()));
  const float* initial = reference.masters().data_as<float>();
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 3.0f * initial[i];
  const Tensor host = Tensor::wrap(weights.data(), Shape{params.flat_numel()}, DType::kF32);
  params.set_weights(*backend, host);
  reference.set_weights(*backend, host);
  EXPECT_EQ(std::memcmp(params.masters().data(), weights.data() + begin, params.masters().nbytes()),
            0);
  EXPECT_EQ(bytes(params.compute()), bytes(reference.compute()));
  EXPECT_EQ(std::memcmp(reference.masters().data(), weights.data(), reference.masters().nbytes()),
            0);
  EXPECT_NE(
      error_of([&] { params.set_weights(*backend, host.view(0, Shape{10})); }).find("expects f32["),
      std::string::npos);
}

TEST(SplitAligned, AlignedPiecesThatCoverTheBuffer) {
  EXPECT_EQ(split_aligned(1000, 3), (std::vector<int64_t>{384, 384, 232}));
  EXPECT_EQ(split_aligned(100, 4), (std::vector<int64_t>{100, 0, 0, 0}));
  EXPECT_EQ(split_aligned(0, 2), (std::vector<int64_t>{0, 0}));
  EXPECT_NE(error_of([] { split_aligned(10, 0); }).find("into 0 parts"), std::string::npos);
}

// A store allocated with a ZeRO-1 shard holds only that range of the masters from the start,
// with the values the whole store has there, and the same compute copy. The large parameter
// spans several staging chunks of the initialisation.
TEST(ParameterStoreAllocate, ShardKeepsOnlyItsRangeFromTheStart) {
  const std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  const auto make = [&](MasterShard shard) {
    ParameterStore params;
    params.add({"small", Shape{300}, Init::kNormal, 0.02f, true});
    params.add({"big", Shape{1100, 1000}, Init::kNormal, 0.5f, true});
    params.add({"ones", Shape{77}, Init::kOnes, 0.0f, false});
    params.allocate(*backend, DType::kBF16, 5, shard);
    return params;
  };
  ParameterStore whole = make({});
  ASSERT_TRUE(whole.keeps_all_masters());
  const std::vector<int64_t> counts = split_aligned(whole.flat_numel(), 3);
  int64_t begin = 0;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    ParameterStore shard = make({rank, 3});
    EXPECT_EQ(shard.masters_begin(), begin);
    ASSERT_EQ(shard.masters().numel(), counts[static_cast<size_t>(rank)]);
    EXPECT_EQ(std::memcmp(shard.masters().data(), whole.masters().data_as<float>() + begin,
                          shard.masters().nbytes()),
              0);
    EXPECT_EQ(bytes(shard.compute()), bytes(whole.compute()));
    for (const Parameter& p : shard.all()) EXPECT_FALSE(p.master.defined()) << p.spec.name;
    begin += counts[static_cast<size_t>(rank)];
  }
  EXPECT_NE(error_of([&] {
              make({3, 3});
            }).find("rank 3 of a world of 3 has no shard"),
            std::string::npos);
}

// The initial value of element i of a kNormal parameter is init_std times the Box-Muller
// normal of the uniforms random_u32(key, 2i) and (key, 2i + 1), key = mix64(seed) ^ FNV-1a of
// the parameter's name: recomputed here in double from dtype.h's random_u32.
TEST(ParameterStoreAllocate, InitialValuesAreTheSeededNormalsOfEachName) {
  const std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  ParameterStore params;
  params.add({"w", Shape{5000}, Init::kNormal, 0.5f, true});
  params.allocate(*backend, DType::kF32, 9);
  uint64_t name_hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : std::string("w")) name_hash = (name_hash ^ c) * 0x100000001b3ULL;
  const uint64_t key = core::mix64(9) ^ name_hash;
  const float* got = params.masters().data_as<float>();
  for (uint64_t i = 0; i < 5000; ++i) {
    const double u1 = (core::random_u32(key, 2 * i) + 1.0) / 4294967297.0;
    const double u2 = core::random_u32(key, 2 * i + 1) / 4294967296.0;
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    ASSERT_EQ(got[i], 0.5f * static_cast<float>(normal)) << "element " << i;
  }
}

}  // namespace
}  // namespace mantissa::train
