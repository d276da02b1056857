// Shape, Tensor and the dtype table of core/tensor/tensor.h: sizes, axis lookup, CPU
// allocation alignment, views and reshapes, and the errors that name what went wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {
namespace {

// Runs `f`, expects it to throw Error, and returns the message.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Shape, NumelIsTheProductOfDimensions) {
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_EQ(Shape({7}).numel(), 7);
  EXPECT_EQ(Shape({2, 3, 4}).numel(), 24);
  EXPECT_EQ(Shape({5, 0, 3}).numel(), 0);
  EXPECT_EQ(Shape(std::vector<int64_t>{1 << 20, 1 << 12}).numel(), int64_t{1} << 32);
  EXPECT_EQ(Shape({2, 3, 4}).rank(), 3);
  EXPECT_EQ(Shape{}.rank(), 0);
}

TEST(Shape, NegativeAxesCountFromTheEnd) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 4);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s[-3], 2);
  for (int axis : {3, -4, 100}) {
    const std::string message = error_message([&] { (void)s[axis]; });
    EXPECT_TRUE(contains(message, "axis " + std::to_string(axis))) << message;
    EXPECT_TRUE(contains(message, "[2, 3, 4]")) << message;
  }
  EXPECT_TRUE(contains(error_message([] { (void)Shape{}[0]; }), "[]"));
}

TEST(Shape, StrAndEquality) {
  EXPECT_EQ(Shape({2, 3, 4}).str(), "[2, 3, 4]");
  EXPECT_EQ(Shape({5}).str(), "[5]");
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_EQ(Shape({2, 3}), Shape(std::vector<int64_t>{2, 3}));
  EXPECT_NE(Shape({2, 3}), Shape({3, 2}));
  EXPECT_NE(Shape({6}), Shape({6, 1}));
}

TEST(Shape, RejectsNegativeDimensions) {
  const std::string message = error_message([] { Shape({2, -1, 3}); });
  EXPECT_TRUE(contains(message, "negative dimension")) << message;
  EXPECT_TRUE(contains(message, "[2, -1, 3]")) << message;
}

TEST(DType, SizesAndNames) {
  struct Row {
    DType dtype;
    size_t size;
    const char* name;
    bool fp8;
  };
  const Row rows[] = {{DType::kF32, 4, "f32", false},  {DType::kBF16, 2, "bf16", false},
                      {DType::kF16, 2, "f16", false},  {DType::kE4M3, 1, "e4m3", true},
                      {DType::kE5M2, 1, "e5m2", true}, {DType::kI32, 4, "i32", false},
                      {DType::kI64, 8, "i64", false},  {DType::kU8, 1, "u8", false}};
  for (const Row& row : rows) {
    EXPECT_EQ(dtype_size(row.dtype), row.size) << row.name;
    EXPECT_STREQ(dtype_name(row.dtype), row.name);
    EXPECT_EQ(is_fp8(row.dtype), row.fp8) << row.name;
  }
}

TEST(Device, Str) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_TRUE(Device::cpu() == Device{});
  EXPECT_TRUE(Device::cuda(0) != Device::cuda(1));
  EXPECT_TRUE(Device::cpu() != Device::cuda(0));
}

// CPU memory starts on a 64-byte boundary (a cache line, the widest vector load) whatever
// the size, zero and odd sizes included, and is writable to its last byte.
TEST(Tensor, EmptyIsAlignedTo64Bytes) {
  std::vector<Tensor> keep;  // all alive at once, so the allocator cannot reuse one address
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kE4M3, DType::kI64}) {
    for (int64_t n : {0, 1, 3, 17, 63, 64, 65, 1000, 4097, 1 << 20}) {
      Tensor t = Tensor::empty(Shape({n}), dtype);
      EXPECT_TRUE(t.defined());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << dtype_name(dtype) << " n=" << n;
      EXPECT_EQ(t.numel(), n);
      EXPECT_EQ(t.nbytes(), static_cast<size_t>(n) * dtype_size(dtype));
      EXPECT_EQ(t.dtype(), dtype);
      EXPECT_TRUE(t.device().is_cpu());
      if (n > 0) static_cast<unsigned char*>(t.data())[t.nbytes() - 1] = 0xAB;
      keep.push_back(t);
    }
  }
}

TEST(Tensor, Accessors) {
  Tensor t = Tensor::empty(Shape({2, 3, 4}), DType::kBF16);
  EXPECT_EQ(t.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.data_as<uint16_t>(), static_cast<uint16_t*>(t.data()));
  EXPECT_EQ(t.describe(), "bf16[2, 3, 4] on cpu");
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, WrapDoesNotCopy) {
  std::vector<float> memory(12, 1.5f);
  Tensor t = Tensor::wrap(memory.data(), Shape({3, 4}), DType::kF32);
  EXPECT_EQ(t.data(), memory.data());
  EXPECT_EQ(t.numel(), 12);
  t.data_as<float>()[5] = 2.5f;
  EXPECT_EQ(memory[5], 2.5f);
}

TEST(Tensor, ViewSharesMemoryAtAnOffset) {
  Tensor flat = Tensor::empty(Shape({100}), DType::kF32);
  for (int i = 0; i < 100; ++i) flat.data_as<float>()[i] = static_cast<float>(i);
  const Tensor v = flat.view(10, Shape({3, 5}));
  EXPECT_EQ(v.shape(), Shape({3, 5}));
  EXPECT_EQ(v.data(), flat.data_as<float>() + 10);
  EXPECT_EQ(v.data_as<float>()[0], 10.0f);
  EXPECT_EQ(v.data_as<float>()[14], 24.0f);
  v.data_as<float>()[1] = -1.0f;
  EXPECT_EQ(flat.data_as<float>()[11], -1.0f);
  // The offset is in elements of the tensor's dtype.
  Tensor halves = Tensor::empty(Shape({8}), DType::kBF16);
  EXPECT_EQ(halves.view(3, Shape({2})).data(), static_cast<char*>(halves.data()) + 6);
  // The whole range, and an empty view at the very end, are in bounds.
  EXPECT_EQ(flat.view(0, Shape({100})).numel(), 100);
  EXPECT_EQ(flat.view(100, Shape({0})).numel(), 0);
}

// A view keeps its storage alive after the tensor it came from is gone.
TEST(Tensor, ViewKeepsStorageAlive) {
  Tensor v;
  {
    Tensor t = Tensor::empty(Shape({64}), DType::kI32);
    for (int i = 0; i < 64; ++i) t.data_as<int32_t>()[i] = i * 3;
    v = t.view(32, Shape({32}));
  }
  EXPECT_EQ(v.data_as<int32_t>()[0], 96);
  EXPECT_EQ(v.data_as<int32_t>()[31], 189);
}

TEST(Tensor, ViewOutOfBoundsNamesTheTensor) {
  const Tensor t = Tensor::empty(Shape({2, 3}), DType::kBF16);
  for (auto [offset, n] : {std::pair<int64_t, int64_t>{4, 3}, {0, 7}, {-1, 2}, {6, 1}}) {
    const std::string message = error_message([&] { (void)t.view(offset, Shape({n})); });
    EXPECT_TRUE(contains(message, "Tensor::view")) << message;
    EXPECT_TRUE(contains(message, "bf16[2, 3] on cpu")) << message;
    std::ostringstream range;
    range << '[' << offset << ", " << offset + n << ')';
    EXPECT_TRUE(contains(message, range.str())) << message;
  }
}

TEST(Tensor, ReshapeKeepsElements) {
  Tensor t = Tensor::empty(Shape({2, 3, 4}), DType::kF16);
  const Tensor r = t.reshape(Shape({6, 4}));
  EXPECT_EQ(r.shape(), Shape({6, 4}));
  EXPECT_EQ(r.data(), t.data());
  EXPECT_EQ(r.dtype(), DType::kF16);
  EXPECT_EQ(t.reshape(Shape({24})).numel(), 24);
  EXPECT_EQ(t.shape(), Shape({2, 3, 4}));  // the original is unchanged
}

TEST(Tensor, ReshapeMismatchNamesTheTensorAndTheShape) {
  const Tensor t = Tensor::empty(Shape({2, 3, 4}), DType::kE4M3);
  const std::string message = error_message([&] { (void)t.reshape(Shape({5, 5})); });
  EXPECT_TRUE(contains(message, "Tensor::reshape")) << message;
  EXPECT_TRUE(contains(message, "e4m3[2, 3, 4] on cpu")) << message;
  EXPECT_TRUE(contains(message, "[5, 5]")) << message;
}

// Errors carry the source location after the message.
TEST(Error, MessageEndsWithTheSourceLocation) {
  const std::string message = error_message([] { MANTISSA_FAIL("something " << 42); });
  EXPECT_TRUE(contains(message, "something 42")) << message;
  EXPECT_TRUE(contains(message, "[test_tensor.cpp:")) << message;
}

// What input or the machine can break is reported as a sentence of its kind, without a source
// location (that is for defects).
TEST(Error, RequireThrowsItsKindWithoutALocation) {
  const auto fail_with = [](ErrorKind kind, const std::string& message) {
    try {
      if (kind == ErrorKind::kConfig) MANTISSA_REQUIRE(false, kConfig, message << " " << 2);
      if (kind == ErrorKind::kFailure) MANTISSA_REQUIRE(false, kFailure, message << " " << 1);
      if (kind == ErrorKind::kDiverged) MANTISSA_REQUIRE(false, kDiverged, message << " " << 4);
    } catch (const Error& e) {
      return std::make_pair(e.kind(), std::string(e.what()));
    }
    return std::make_pair(ErrorKind::kFailure, std::string("nothing thrown"));
  };
  EXPECT_EQ(fail_with(ErrorKind::kConfig, "bad field"),
            std::make_pair(ErrorKind::kConfig, std::string("bad field 2")));
  EXPECT_EQ(fail_with(ErrorKind::kFailure, "disk full"),
            std::make_pair(ErrorKind::kFailure, std::string("disk full 1")));
  EXPECT_EQ(fail_with(ErrorKind::kDiverged, "loss is nan"),
            std::make_pair(ErrorKind::kDiverged, std::string("loss is nan 4")));
  int built = 0;  // the message is built only when the condition fails
  EXPECT_NO_THROW(MANTISSA_REQUIRE(true, kConfig, "fine " << ++built));
  EXPECT_EQ(built, 0);
}

}  // namespace
}  // namespace mantissa::core
