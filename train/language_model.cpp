#include "train/language_model.h"

#include "core/error.h"

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

double mean_loss(core::Backend& backend, const core::Tensor& token_losses) {
  const int64_t n = token_losses.numel();
  MANTISSA_CHECK(n > 0 && token_losses.dtype() == core::DType::kF32,
                 "mean_loss: token losses " << token_losses.describe() << " must be non-empty F32");
  core::Tensor host = core::Tensor::empty(core::Shape{n}, core::DType::kF32);
  backend.copy(token_losses, host);
  backend.synchronize();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += host.data_as<float>()[i];
  return sum / static_cast<double>(n);
}

double transformer_flops_per_token(int64_t parameters, int64_t n_layer, int64_t n_embd,
                                   int64_t seq_len) {
  return 6.0 * static_cast<double>(parameters) +
         6.0 * static_cast<double>(n_layer * n_embd * seq_len);
}

}  // namespace mantissa::train
