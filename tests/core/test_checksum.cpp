// The consistency check's checksum (Backend::checksum, core/ops/math/checksum.h) on the CPU:
// the definition recomputed one term at a time, independence of the thread count, and that the
// faults the check exists for (a flipped bit, swapped or moved words) change it.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/backend.h"
#include "core/ops/math/checksum.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

// The definition, term by term, in index order.
uint64_t checksum_by_definition(const std::vector<uint8_t>& bytes) {
  uint64_t sum = 0;
  const size_t words = bytes.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    sum += mix64(w ^ mix64(i + 0x9e3779b97f4a7c15ULL));
  }
  for (size_t j = words * 8; j < bytes.size(); ++j) sum += mix64(bytes[j] + (uint64_t{j} << 8));
  return sum;
}

class Checksum : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::mt19937_64 rng{77};

  // Tensors have no byte dtype: the bytes go into an E4M3 tensor (one byte per element), whose
  // codes the checksum reads as they are.
  Tensor tensor_of(const std::vector<uint8_t>& bytes) {
    Tensor t = Tensor::empty(Shape{static_cast<int64_t>(bytes.size())}, DType::kE4M3);
    if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    return t;
  }
  uint64_t op(const std::vector<uint8_t>& bytes) {
    Tensor out = i64_scalar(-1);
    backend->checksum(tensor_of(bytes), out);
    return static_cast<uint64_t>(out.data_as<int64_t>()[0]);
  }
  std::vector<uint8_t> random_bytes(size_t n) {
    std::vector<uint8_t> b(n);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    return b;
  }
};

TEST_F(Checksum, IsTheSumOfItsTermsAtEveryLength) {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 24; ++n) lengths.push_back(n);
  lengths.push_back(1000003);  // many words per thread, and a tail
  for (size_t n : lengths) {
    const std::vector<uint8_t> bytes = random_bytes(n);
    EXPECT_EQ(op(bytes), checksum_by_definition(bytes)) << n << " bytes";
  }
}

TEST_F(Checksum, DoesNotDependOnTheThreadCount) {
  const std::vector<uint8_t> bytes = random_bytes(800005);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const uint64_t one = op(bytes);
  omp_set_num_threads(3);
  const uint64_t three = op(bytes);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);
  EXPECT_EQ(one, op(bytes));
}

TEST_F(Checksum, ChangesWithAFlippedBitSwappedWordsAndMovedWords) {
  const std::vector<uint8_t> bytes = random_bytes(4096 + 5);
  const uint64_t original = op(bytes);
  for (size_t bit : {size_t{0}, size_t{8 * 1000 + 3}, size_t{8 * 4100 + 7}}) {
    std::vector<uint8_t> flipped = bytes;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(op(flipped), original) << "bit " << bit;
  }
  std::vector<uint8_t> swapped = bytes;
  std::swap_ranges(swapped.begin() + 8, swapped.begin() + 16, swapped.begin() + 800);
  ASSERT_NE(swapped, bytes);
  EXPECT_NE(op(swapped), original);
  // The same words, one position later: a plain sum of the words could not tell them apart.
  const std::vector<uint8_t> zero_word(8, 0);
  std::vector<uint8_t> words_then_zero(bytes.begin(), bytes.begin() + 4096);
  words_then_zero.insert(words_then_zero.end(), zero_word.begin(), zero_word.end());
  std::vector<uint8_t> zero_then_words = zero_word;
  zero_then_words.insert(zero_then_words.end(), bytes.begin(), bytes.begin() + 4096);
  EXPECT_NE(op(words_then_zero), op(zero_then_words));
}

TEST_F(Checksum, RejectsAMisalignedBufferAndAnOutThatIsNoI64Scalar) {
  Tensor x = Tensor::empty(Shape{16}, DType::kF32);
  Tensor out = i64_scalar(0);
  expect_error([&] { backend->checksum(x.view(1, Shape{8}), out); }, {"checksum", "8-byte"});
  Tensor f32_out = f32_scalar(0.0f);
  expect_error([&] { backend->checksum(x, f32_out); }, {"checksum", "out"});
}

}  // namespace
}  // namespace mantissa::core
