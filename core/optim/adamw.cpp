#include "core/optim/adamw.h"

#include "core/config_check.h"

namespace mantissa::core {

void validate(const AdamWConfig& config) {
  in_unit_range("adamw.beta1", config.beta1, true);
  in_unit_range("adamw.beta2", config.beta2, true);
  positive("adamw.eps", config.eps);
  non_negative("adamw.weight_decay", config.weight_decay);
}

AdamW::AdamW(Backend& backend, std::vector<ParamRange> ranges, int64_t flat_numel,
             const AdamWConfig& config)
    : ranges_(std::move(ranges)), config_(config) {
  validate(config_);
  m_ = Tensor::empty(Shape{flat_numel}, DType::kF32, backend.device());
  v_ = Tensor::empty(Shape{flat_numel}, DType::kF32, backend.device());
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
}

void AdamW::step(Backend& backend, Tensor& masters, const Tensor& grads, Tensor* compute, float lr,
                 float grad_scale) {
  ++steps_;
  AdamWParams p;
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.step = steps_;
  p.grad_scale = grad_scale;
  p.weight_decay = config_.weight_decay;
  backend.adamw(masters, grads, m_, v_, compute, ranges_, p);
}

}  // namespace mantissa::core
