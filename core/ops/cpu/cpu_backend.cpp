#include "core/ops/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/cpu_switch.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

// The switches are read here, on the calling thread, before any op: an op may first read
// one inside an OpenMP region, where a bad value's exception would end the process.
std::unique_ptr<Backend> make_cpu_backend() {
  check_cpu_switches();
  return std::make_unique<CpuBackend>();
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  MANTISSA_CHECK(src.device().is_cpu() && dst.device().is_cpu(),
                 "copy: the CPU backend copies host memory only (src " << src.describe() << ", dst "
                                                                       << dst.describe() << ")");
  check_copy_sizes(src, dst);
  std::memmove(dst.data(), src.data(), src.nbytes());
}

void CpuBackend::fill(Tensor& dst, float value) {
  check_fill(dst, device());
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::kI32: {
      auto* p = dst.data_as<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      return;
    }
    case DType::kI64: {
      auto* p = dst.data_as<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value);
      return;
    }
    case DType::kU8:
      std::memset(dst.data(), static_cast<uint8_t>(value), static_cast<size_t>(n));
      return;
    default: {
      // Round once, then replicate the bit pattern as an integer of the element's width (a
      // loop the compiler vectorises; zeroing the gradients runs this every step).
      float one = value;
      unsigned char code[4];
      narrow_from_f32(&one, code, dst.dtype(), 1, NarrowOptions{});
      const auto replicate = [&](auto pattern) {
        std::memcpy(&pattern, code, sizeof pattern);
        std::fill_n(static_cast<decltype(pattern)*>(dst.data()), n, pattern);
      };
      switch (dtype_size(dst.dtype())) {
        case 1: return replicate(uint8_t{});
        case 2: return replicate(uint16_t{});
        case 4: return replicate(uint32_t{});
        default: MANTISSA_FAIL("fill: no " << dtype_name(dst.dtype()) << " pattern");
      }
    }
  }
}

}  // namespace mantissa::core
