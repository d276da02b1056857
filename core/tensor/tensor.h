// Tensor: a typed, shaped, contiguous (row-major) view of device or host memory.
//
// Tensors share their Storage, so a view (a sub-range of a flat buffer reinterpreted with a
// new shape) costs nothing and keeps the memory alive. Every tensor is contiguous: the flat
// parameter/gradient buffers and the per-parameter views into them are the only layouts the
// framework needs, and contiguity keeps every kernel a plain loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace mantissa::core {

enum class DType : uint8_t { kF32, kBF16, kF16, kE4M3, kE5M2, kI32, kI64, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
bool is_fp8(DType dtype);

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceKind::kCUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool operator==(const Device& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
  std::string str() const;
};

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int axis) const;  // negative axes count from the end
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  bool operator==(const Shape& other) const { return dims_ == other.dims_; }
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::vector<int64_t> dims_;
};

// Owns one allocation; freed through the allocator that made it.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual void* data() = 0;
  virtual size_t nbytes() const = 0;
  virtual Device device() const = 0;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory from the device's allocator.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Wraps memory the caller keeps alive (no ownership).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr || data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  int64_t dim(int axis) const { return shape_[axis]; }

  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  // Elements [offset, offset + shape.numel()) of this tensor, seen with a new shape.
  Tensor view(int64_t offset, const Shape& shape) const;
  // The same elements with a new shape of equal numel.
  Tensor reshape(const Shape& shape) const;
  // "bf16[2, 3] on cpu" for error messages.
  std::string describe() const;
  // The allocation this tensor keeps alive, watched without keeping it (empty for wrapped
  // memory): whether anyone still holds it, e.g. a collective in flight (dist::Request).
  std::weak_ptr<const Storage> storage_watch() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_;
};

}  // namespace mantissa::core
