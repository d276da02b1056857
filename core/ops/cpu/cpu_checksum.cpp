// The consistency check's checksum on the CPU (core/ops/math/checksum.h holds the formula).
#include <cstring>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/math/checksum.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

uint64_t checksum_bytes(const void* data, size_t nbytes) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const int64_t words = static_cast<int64_t>(nbytes / 8);
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    sum += checksum_word(w, static_cast<uint64_t>(i));
  }
  for (size_t j = static_cast<size_t>(words) * 8; j < nbytes; ++j) {
    sum += checksum_tail_byte(bytes[j], j);
  }
  return sum;
}

void CpuBackend::checksum(const Tensor& x, Tensor& out) {
  check_checksum(x, out, device());
  out.data_as<int64_t>()[0] = static_cast<int64_t>(checksum_bytes(x.data(), x.nbytes()));
}

}  // namespace mantissa::core
