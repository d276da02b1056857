// Argument validation shared by every backend, so that a bad call fails the same way (with
// the op, the operand and the shapes named) on the CPU and on the GPU.
#pragma once

#include <initializer_list>

#include "core/tensor/tensor.h"

namespace mantissa::core {

// `t` is defined, lives on `device`, and has one of the `allowed` dtypes.
void check_operand(const char* op, const char* name, const Tensor& t, Device device,
                   std::initializer_list<DType> allowed);
void check_rank(const char* op, const char* name, const Tensor& t, int rank);
void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected);
// A 1-element F32 tensor on `device` (scales, amax, norms, flags); I64 with `dtype`.
void check_scalar(const char* op, const char* name, const Tensor& t, Device device,
                  DType dtype = DType::kF32);

}  // namespace mantissa::core
