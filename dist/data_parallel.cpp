// DataParallel: the facade a Trainer uses, composed of the gradient sync
// (dist/bucketed_grad_sync.h), the ZeRO-1 shard and optimizer (dist/zero1_optimizer.h) and the
// consistency check (dist/consistency_check.h), all over one control communicator with the
// step's accounting (dist/step_comm.h).
#include "dist/data_parallel.h"

#include "core/error.h"
#include "dist/bucketed_grad_sync.h"
#include "dist/consistency_check.h"
#include "dist/step_comm.h"
#include "dist/zero1_optimizer.h"

namespace mantissa::dist {
namespace {

class DataParallelImpl final : public DataParallel {
 public:
  // The ZeRO-1 shard is cut before the buckets are allocated, so that the masters of the other
  // shards are freed first.
  DataParallelImpl(core::Backend& backend, train::ParameterStore& params, const DistConfig& config,
                   std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> host_scalars)
      : backend_(backend),
        params_(params),
        comm_(backend, std::move(comm), std::move(host_scalars)),
        zero1_(config.zero_stage == 1 ? std::make_unique<Zero1Shard>(backend, params, comm_)
                                      : nullptr),
        sync_(backend, params, config, comm_, zero1_ ? zero1_->offsets() : std::vector<int64_t>{}) {
  }

  // --- GradientSync -------------------------------------------------------------------
  void grad_ready(int param) override { sync_.grad_ready(param); }
  void finish(core::Tensor& grads, core::Tensor& check) override { sync_.finish(grads, check); }
  bool saw_nonfinite(float check) const override { return sync_.saw_nonfinite(check); }
  void max_across_ranks(std::vector<float>& values) override { sync_.max_across_ranks(values); }
  double sum_across_ranks(double value) override { return sync_.sum_across_ranks(value); }

  // --- DataParallel -------------------------------------------------------------------
  void broadcast_parameters() override {
    if (zero1_) {
      zero1_->refresh_compute_copy();
      return;
    }
    core::Tensor& masters = params_.masters();
    comm_.timed_wait(comm_.ctrl().broadcast(masters, 0), masters.nbytes());
    params_.refresh_compute_copy(backend_);
    backend_.synchronize();
  }

  void check_consistency(const ReplicaState& state) override {
    dist::check_consistency(comm_, backend_, params_, zero1_ != nullptr, state, hosts_by_rank_);
  }
  void set_rank_hosts(std::vector<std::string> hosts_by_rank) override {
    hosts_by_rank_ = std::move(hosts_by_rank);
  }

  double last_step_comm_seconds() const override { return comm_.seconds(); }
  int64_t last_step_comm_bytes() const override { return comm_.bytes(); }

  std::unique_ptr<train::Optimizer> make_optimizer(const core::AdamWConfig& config) override {
    if (zero1_) return std::make_unique<Zero1AdamW>(*zero1_, config);
    return std::make_unique<train::LocalAdamW>(backend_, params_, config);
  }

  std::vector<std::pair<int64_t, int64_t>> buckets() const override { return sync_.buckets(); }
  Communicator& communicator() override { return comm_.ctrl(); }

 private:
  core::Backend& backend_;
  train::ParameterStore& params_;
  StepComm comm_;
  std::unique_ptr<Zero1Shard> zero1_;  // ZeRO-1 only
  BucketedGradSync sync_;
  std::vector<std::string> hosts_by_rank_;  // empty: messages name ranks alone
};

}  // namespace

std::unique_ptr<DataParallel> DataParallel::create(core::Backend& backend,
                                                   train::ParameterStore& params,
                                                   const DistConfig& config,
                                                   std::unique_ptr<Communicator> comm,
                                                   std::unique_ptr<Communicator> host_scalars) {
  validate(config);
  MANTISSA_CHECK(params.flat_numel() > 0 && params.masters().defined(),
                 "DataParallel::create: the parameter store is not allocated");
  if (config.zero_stage == 0)
    params.require_all_masters("DataParallel::create (dist.zero_stage 0)");
  MANTISSA_CHECK(
      comm != nullptr && comm->device() == backend.device(),
      "DataParallel::create: the communicator's buffers must live on " << backend.device().str());
  return std::make_unique<DataParallelImpl>(backend, params, config, std::move(comm),
                                            std::move(host_scalars));
}

}  // namespace mantissa::dist
