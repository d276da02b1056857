#include "core/tensor/tensor.h"

#include "core/error.h"
#include "core/strings.h"
#include "core/tensor/allocator.h"

namespace mantissa::core {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kE4M3: return 1;
    case DType::kE5M2: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  MANTISSA_FAIL("dtype_size: unknown dtype " << static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "unknown";
}

bool is_fp8(DType dtype) {
  return dtype == DType::kE4M3 || dtype == DType::kE5M2;
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (int64_t d : dims_) MANTISSA_CHECK(d >= 0, "Shape: negative dimension in " << str());
}

int64_t Shape::operator[](int axis) const {
  const int resolved = axis < 0 ? axis + rank() : axis;
  MANTISSA_CHECK(resolved >= 0 && resolved < rank(),
                 "Shape: axis " << axis << " out of range for " << str());
  return dims_[resolved];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::str() const {
  std::string text = "[";
  text += join(dims_, ", ", [](int64_t d) { return std::to_string(d); });
  return text + "]";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  t.storage_ = device.is_cpu() ? allocate_cpu(nbytes) : allocate_cuda(nbytes, device.index);
  t.data_ = t.storage_->data();
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  MANTISSA_CHECK(offset >= 0 && offset + shape.numel() <= numel(),
                 "Tensor::view: elements [" << offset << ", " << offset + shape.numel()
                                            << ") outside " << describe());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_ = shape;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MANTISSA_CHECK(shape.numel() == numel(),
                 "Tensor::reshape: " << describe() << " cannot become " << shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device_.str();
}

}  // namespace mantissa::core
