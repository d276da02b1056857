#include "core/ops/op_checks.h"

#include "core/error.h"

namespace mantissa::core {

void check_operand(const char* op, const char* name, const Tensor& t, Device device,
                   std::initializer_list<DType> allowed) {
  MANTISSA_CHECK(t.defined(), op << ": operand " << name << " is an undefined tensor");
  MANTISSA_CHECK(t.device() == device, op << ": operand " << name << " " << t.describe()
                                          << " is not on the backend's device " << device.str());
  bool ok = false;
  for (DType d : allowed) ok = ok || d == t.dtype();
  if (!ok) {
    std::string names;
    for (DType d : allowed) names += std::string(names.empty() ? "" : ", ") + dtype_name(d);
    MANTISSA_FAIL(op << ": operand " << name << " " << t.describe()
                     << " has an unsupported dtype (allowed: " << names << ")");
  }
}

void check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  MANTISSA_CHECK(t.shape().rank() == rank, op << ": operand " << name << " " << t.describe()
                                              << " must have " << rank << " dimensions");
}

void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  MANTISSA_CHECK(a.shape() == b.shape(), op << ": operands " << name_a << " " << a.describe()
                                            << " and " << name_b << " " << b.describe()
                                            << " must have the same shape");
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  MANTISSA_CHECK(t.shape() == expected, op << ": operand " << name << " " << t.describe()
                                           << " must have shape " << expected.str());
}

void check_scalar(const char* op, const char* name, const Tensor& t, Device device,
                  DType dtype) {
  check_operand(op, name, t, device, {dtype});
  MANTISSA_CHECK(t.numel() == 1, op << ": operand " << name << " " << t.describe()
                                    << " must hold exactly one element");
}

}  // namespace mantissa::core
