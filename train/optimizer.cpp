#include "train/optimizer.h"

namespace mantissa::train {

LocalAdamW::LocalAdamW(core::Backend& backend, const ParameterStore& params,
                       const core::AdamWConfig& config)
    : backend_(backend),
      flat_numel_(params.flat_numel()),
      adamw_(backend, adamw_ranges(params), params.flat_numel(), config) {
  params.require_all_masters("LocalAdamW");
}

void LocalAdamW::step(ParameterStore& params, float lr, float grad_scale) {
  adamw_.step(backend_, params.masters(), params.grads(), &params.compute(), lr, grad_scale);
}

std::vector<core::ParamRange> adamw_ranges(const ParameterStore& params) {
  std::vector<core::ParamRange> ranges;
  for (const Parameter& p : params.all()) {
    ranges.push_back({p.offset, p.numel(), p.spec.weight_decay});
  }
  return ranges;
}

}  // namespace mantissa::train
