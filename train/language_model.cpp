#include "train/language_model.h"

namespace mantissa::train {

BatchTensors upload(const Batch& batch, core::Backend& backend) {
  const core::Shape shape{batch.batch_size, batch.seq_len};
  BatchTensors out{core::Tensor::empty(shape, core::DType::kI32, backend.device()),
                   core::Tensor::empty(shape, core::DType::kI32, backend.device())};
  backend.copy(
      core::Tensor::wrap(const_cast<int32_t*>(batch.tokens.data()), shape, core::DType::kI32),
      out.tokens);
  backend.copy(
      core::Tensor::wrap(const_cast<int32_t*>(batch.targets.data()), shape, core::DType::kI32),
      out.targets);
  return out;
}

}  // namespace mantissa::train
