#include "core/ops/rope_table.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace mantissa::core {

Tensor make_rope_table(Backend& backend, int64_t positions, int64_t head_dim, double theta) {
  MANTISSA_CHECK(head_dim > 0 && head_dim % 2 == 0,
                 "make_rope_table: head_dim = " << head_dim << " must be even and positive");
  MANTISSA_CHECK(positions > 0,
                 "make_rope_table: positions = " << positions << " must be positive");
  MANTISSA_CHECK(
      theta > 1.0 && theta <= std::numeric_limits<float>::max(),
      "make_rope_table: theta = " << theta << " must be greater than 1 and a finite float");
  const int64_t half = head_dim / 2;
  Tensor host = Tensor::empty(Shape{positions, head_dim}, DType::kF32);
  float* t = host.data_as<float>();
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const auto power = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(exponent)));
    const float inv_freq = 1.0f / power;
    for (int64_t p = 0; p < positions; ++p) {
      const float angle = static_cast<float>(p) * inv_freq;
      t[p * head_dim + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t[p * head_dim + half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  if (backend.device() == host.device()) return host;
  Tensor table = Tensor::empty(host.shape(), DType::kF32, backend.device());
  backend.copy(host, table);  // the host copy is read before copy() returns
  return table;
}

}  // namespace mantissa::core
