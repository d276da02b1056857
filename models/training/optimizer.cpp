#include "models/training/optimizer.h"

#include "core/error.h"

namespace mantissa::models {

LocalAdamW::LocalAdamW(core::Backend& backend, const ParameterStore& params,
                       const core::AdamWConfig& config)
    : backend_(backend),
      flat_numel_(params.flat_numel()),
      adamw_(backend, adamw_ranges(params), params.flat_numel(), config) {
  MANTISSA_CHECK(params.keeps_all_masters(),
                 "LocalAdamW: the parameter store keeps only the masters ["
                     << params.masters_begin() << ", "
                     << params.masters_begin() + params.masters().numel() << ") of "
                     << params.flat_numel() << " (sharded for ZeRO-1?)");
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

}  // namespace mantissa::models
