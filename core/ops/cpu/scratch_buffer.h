// A buffer reused across calls of a CPU op: it grows to the largest request and stays, so
// after the first training step the op allocates (and page-faults) nothing. Ops keep one per
// thread (thread_local), so concurrent calls from different threads never share one.
//
// The buffer starts on a 64-byte cache line. malloc aligns only to 16 bytes (a large block
// sits 16 bytes past a page boundary), and a 64-byte AMX tile row or AVX-512 vector read from
// such a buffer straddles two lines: the AMX GEMM ran 25% slower on packed operands 16 bytes
// off the line (one Sapphire Rapids core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

namespace mantissa::core {

template <class T>
class ScratchBuffer {
  static_assert(std::is_trivially_destructible_v<T>, "elements are never destroyed");

 public:
  static constexpr std::align_val_t kAlignment{64};

  // At least n elements, default-initialised; earlier contents are not kept when it grows.
  T* get(int64_t n) {
    if (n > capacity_) {
      data_.reset(static_cast<T*>(::operator new(static_cast<size_t>(n) * sizeof(T), kAlignment)));
      std::uninitialized_default_construct_n(data_.get(), n);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  struct Release {
    void operator()(T* p) const { ::operator delete(p, kAlignment); }
  };
  std::unique_ptr<T, Release> data_;
  int64_t capacity_ = 0;
};

}  // namespace mantissa::core
