// A buffer reused across calls of a CPU op: it grows to the largest request and stays, so
// after the first training step the op allocates (and page-faults) nothing. Ops keep one per
// thread (thread_local), so concurrent calls from different threads never share one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace mantissa::core {

template <class T>
class ScratchBuffer {
 public:
  // At least n elements, uninitialised; earlier contents are not kept when it grows.
  T* get(int64_t n) {
    if (n > capacity_) {
      data_ = std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n));
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<T[]> data_;
  int64_t capacity_ = 0;
};

}  // namespace mantissa::core
