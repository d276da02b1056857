#include "core/optim/adamw.h"

#include "core/config_check.h"
#include "core/error.h"

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
  for (const ParamRange& r : ranges_) {
    MANTISSA_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= flat_numel,
                   "AdamW: parameter range [" << r.offset << ", " << r.offset + r.numel
                                              << ") outside the flat buffer of " << flat_numel);
  }
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
  for (const ParamRange& r : ranges_) {
    if (r.numel == 0) continue;
    const Shape shape{r.numel};
    Tensor param = masters.view(r.offset, shape);
    Tensor m = m_.view(r.offset, shape);
    Tensor v = v_.view(r.offset, shape);
    Tensor copy = compute ? compute->view(r.offset, shape) : Tensor();
    p.weight_decay = r.weight_decay ? config_.weight_decay : 0.0f;
    backend.adamw(param, grads.view(r.offset, shape), m, v, compute ? &copy : nullptr, p);
  }
}

}  // namespace mantissa::core
