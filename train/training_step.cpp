#include "train/training_step.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "train/fp8_operands.h"

namespace mantissa::train {

using core::DType;
using core::Shape;
using core::Tensor;

TrainingStep::TrainingStep(LanguageModel& model, core::Backend& backend,
                           const core::PrecisionPolicy& policy, core::LossScaler& scaler,
                           Optimizer& optimizer, const core::LrSchedule& schedule, float grad_clip)
    : model_(model),
      backend_(backend),
      policy_(policy),
      scaler_(scaler),
      optimizer_(optimizer),
      schedule_(schedule),
      grad_clip_(grad_clip) {}

StepReport TrainingStep::run(int64_t step, const std::vector<Batch>& micro_batches,
                             GradientSync* sync) {
  MANTISSA_CHECK(!micro_batches.empty(), "TrainingStep::run: no micro-batches");
  StepReport report;
  report.step = step;
  report.loss_scale = scaler_.scale();
  report.lr = schedule_.at(step);

  ParameterStore& params = model_.parameters();
  params.zero_grad(backend_);
  if (Fp8Operands* fp8 = model_.fp8_operands()) fp8->begin_step(backend_);
  StepContext ctx{backend_, policy_, model_.fp8_operands(), {}, step};

  // d(mean loss)/d(token loss) = 1 / (all tokens of the step), times the loss scale.
  int64_t tokens = 0;
  for (const Batch& b : micro_batches) tokens += b.batch_size * b.seq_len;
  const float dloss =
      static_cast<float>(static_cast<double>(scaler_.scale()) / static_cast<double>(tokens));
  // Every token's loss stays on the device until it goes to the host with the step's other
  // scalars, at their one synchronisation below (a copy into host memory per micro-batch would
  // make the host wait for each forward).
  Tensor losses_all = Tensor::empty(Shape{tokens}, DType::kF32, backend_.device());
  int64_t copied = 0;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const Batch& mb = micro_batches[i];
    const bool last = i + 1 == micro_batches.size();
    if (sync && last) ctx.grad_ready = [sync](int param) { sync->grad_ready(param); };
    const BatchTensors device_batch = upload(mb, backend_);
    const Tensor losses = model_.forward(ctx, device_batch, dloss);
    Tensor slot = losses_all.view(copied, Shape{losses.numel()});
    backend_.copy(losses, slot);
    copied += losses.numel();
    model_.backward(ctx);
  }
  report.tokens = tokens;

  // The range this rank's optimizer updates: everything, or its ZeRO-1 shard. Only that
  // range of the gradients is averaged after finish(), so only it is checked and normed.
  const int64_t begin = optimizer_.owned_begin();
  const int64_t end = optimizer_.owned_end();
  const bool sharded = begin != 0 || end != params.flat_numel();
  MANTISSA_CHECK(sync || !sharded, "TrainingStep::run: the optimizer owns only ["
                                       << begin << ", " << end << ") of " << params.flat_numel()
                                       << " parameters, which needs a GradientSync");
  // Everything the host decides on is read back at one host synchronisation: the token
  // losses, and one 20-byte device buffer of the non-finite flag, the squared gradient norm,
  // the first non-finite index and the gradient sync's check (F32 found, F32 norm^2, I64 first
  // index at byte 8, F32 sync check at byte 16), copied with one copy each; the FP8 amaxes
  // (final since backward) are copied before the same synchronize(). The norm is therefore
  // summed before the skip decision; a skipped step ignores it (it may be inf).
  Tensor scalars = Tensor::empty(Shape{5}, DType::kF32, backend_.device());
  Tensor found = scalars.view(0, Shape{1});
  Tensor norm_sq = scalars.view(1, Shape{1});
  Tensor first = Tensor::wrap(static_cast<char*>(scalars.data()) + 8, Shape{1}, DType::kI64,
                              backend_.device());
  Tensor sync_check = scalars.view(4, Shape{1});  // written by the sync; unread without one

  Tensor& grads = params.grads();
  if (sync) sync->finish(grads, sync_check);
  Tensor owned = grads.view(begin, Shape{end - begin});
  if (before_check) before_check(owned, step);

  backend_.fill(found, 0.0f);
  backend_.fill(norm_sq, 0.0f);
  backend_.unscale_check_finite(owned, scaler_.inv_scale(), found, &first);
  backend_.sum_squares(owned, norm_sq);
  Tensor host_losses = Tensor::empty(Shape{tokens}, DType::kF32);
  backend_.copy(losses_all, host_losses);
  Tensor host_scalars = Tensor::empty(Shape{5}, DType::kF32);
  backend_.copy(scalars, host_scalars);
  Fp8Operands* fp8 = model_.fp8_operands();
  // read_amaxes() copies and synchronises once, which also completes host_scalars.
  std::vector<float> amaxes = fp8 ? fp8->read_amaxes(backend_) : std::vector<float>{};
  if (!fp8) backend_.synchronize();
  double loss_sum = 0.0;
  for (int64_t i = 0; i < tokens; ++i) loss_sum += host_losses.data_as<float>()[i];
  report.loss = loss_sum / static_cast<double>(tokens);
  const float* host = host_scalars.data_as<float>();
  int64_t first_index = 0;
  std::memcpy(&first_index, host + 2, sizeof first_index);
  // This rank's first parameter with a non-finite gradient, as its index in the model's order
  // (the vocabulary padding after the last); -1 when none.
  int first_param = -1;
  if (first_index >= 0) {
    const int param = params.find_by_flat_index(begin + first_index);
    first_param = param >= 0 ? param : params.size();
  }
  // The overflow flag, the first non-finite parameter of any rank and the FP8 amaxes,
  // MAX-reduced over the ranks in one collective: element 0 the flag, element 1 minus the
  // parameter's index (-inf for none; indices are exact in a float), then the amaxes (a MAX
  // drops NaN, every comparison with it being false: it goes as inf).
  const bool nonfinite_before_sync = sync && sync->saw_nonfinite(host[4]);
  std::vector<float> maxima{(nonfinite_before_sync || host[0] != 0.0f) ? 1.0f : 0.0f,
                            first_param >= 0 ? -static_cast<float>(first_param) : -INFINITY};
  for (float a : amaxes) maxima.push_back(std::isnan(a) ? INFINITY : a);
  if (sync) sync->max_across_ranks(maxima);
  if (fp8) fp8->update_scales(backend_, std::vector<float>(maxima.begin() + 2, maxima.end()));
  if (std::isfinite(maxima[1])) {
    const int param = static_cast<int>(-maxima[1]);
    report.nonfinite_param = param < params.size() ? params[param].spec.name : "(padding)";
  }

  try {
    report.skipped = scaler_.update(maxima[0] != 0.0f);
  } catch (const core::DivergedError& e) {
    report.skipped = true;
    throw StepDiverged(e.what(), report);
  }
  if (report.skipped) return report;

  double sum_squares = static_cast<double>(host[1]);
  // Every rank sums the shards in the same order, so all of them clip by the same factor.
  if (sharded) sum_squares = sync->sum_across_ranks(sum_squares);
  report.grad_norm = std::sqrt(sum_squares);
  const double clip =
      (grad_clip_ > 0.0f && report.grad_norm > grad_clip_) ? grad_clip_ / report.grad_norm : 1.0;
  optimizer_.step(params, static_cast<float>(report.lr), static_cast<float>(clip));
  return report;
}

}  // namespace mantissa::train
