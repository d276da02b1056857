// Data parallelism as the Trainer sees it: the contract between dist/ and launcher/.
//
// One object per process. It plugs into train::TrainingStep as its GradientSync (bucketed,
// overlapped, reduced-precision gradient all-reduce; one overflow decision for all ranks;
// MAX-reduced FP8 amaxes), and also provides the few other cross-rank operations a Trainer
// needs: the start-up broadcast, the consistency check, the mean loss and the agreement on
// a stop step.
//
// It is a facade over the pieces that do the work, all on one control communicator that also
// keeps the step's communication counts (dist/step_comm.h):
//   dist/bucketed_grad_sync.h  BucketedGradSync, the gradient sync (train::GradientSync);
//   dist/zero1_optimizer.h     Zero1Shard and Zero1AdamW, the ZeRO-1 shard and its optimizer;
//   dist/consistency_check.h   check_consistency and ReplicaState;
//   dist/dist_config.h         DistConfig and validate().
//
// How a Trainer builds the pieces (every rank runs the same code; launcher/trainer.cpp):
//
//   dist::World world(&argc, &argv);
//   auto backend = ...;                                   // CPU, or the GPU local_rank picks
//   train::MasterShard shard = zero_stage == 1 ? train::MasterShard{world.rank(), world.size()}
//                                              : train::MasterShard{};
//   models::GPT2 model(gpt_config, *backend, policy, seed, fp8_config, shard);  // same seed
//   auto dp = dist::DataParallel::create(world, *backend, model.parameters(), dist_config);
//   std::unique_ptr<train::Optimizer> opt = dp->make_optimizer(adamw_config);
//   core::LossScaler scaler(loss_scale_config);
//   train::TrainingStep step(model, *backend, policy, scaler, *opt, schedule, grad_clip);
//   step.before_check = train::nonfinite_injector(*backend, world.rank(),
//                                                   debug.inject_nonfinite_rank, steps);
//   train::DataLoader loader(corpus, {.seq_len = T, .micro_batch = B,
//                                      .world_size = world.size(), .rank = world.rank(),
//                                      .seed = seed});
//   dp->broadcast_parameters();                           // or restore a checkpoint instead
//   for (s = start; s < steps; ++s) {
//     StepReport r = step.run(s, {loader.next(), ...}, dp.get());  // accumulation's batches
//     double mean_loss = dp->sum_across_ranks(r.loss) / world.size();
//     std::vector<float> stop{signal received ? 1.0f : 0.0f};
//     dp->max_across_ranks(stop);                         // every rank stops at the same step
//     if (every consistency_check_every, and before every checkpoint)
//       dp->check_consistency({.step = s + 1, .scaler = scaler.state(), .fp8_scales = ...,
//                              .optimizer_steps = opt->steps_taken()});
//   }
//
// ZeRO-1 (zero_stage 1): the parameter store keeps only this rank's shard of the FP32 masters
// -- allocated so (train::MasterShard{rank, world}: all masters are never held at once), or
// cut down by create() (ParameterStore::keep_masters; the rest is freed) -- and make_optimizer()'s
// moments cover the same shard, so masters and moments take 12 bytes per parameter / N on
// each rank. The gradients and the compute copy stay whole: the compute copy is all-gathered
// from every rank's shard after each update, and is then the only whole copy of the weights.
//
// Checkpoints: under ZeRO-1 each rank saves and restores params.masters() (the flat range from
// params.masters_begin()) and opt->first_moment()/second_moment() (the range
// opt->owned_begin()..owned_end()), its shard. Without ZeRO, where those are whole buffers
// replicated on every rank, the Trainer saves and restores 1/N of them per rank and
// all-gathers the restored parts over communicator(). After restoring masters, call
// opt->refresh_compute_copy(params) (collective under ZeRO-1).
//
// Failures: every collective waits at most config.timeout_s; past it the job ends (MPI_Abort,
// exit code 3, core::ErrorKind::kPeerLost) with "mantissa: rank R: ... rank(s) [K] did not answer".
// check_consistency throws core::Error on every rank alike, naming ranks and fields.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/backend.h"
#include "core/optim/adamw.h"
#include "dist/communicator.h"
#include "dist/consistency_check.h"
#include "dist/dist_config.h"
#include "dist/world.h"
#include "train/gradient_sync.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace mantissa::dist {

class DataParallel : public train::GradientSync {
 public:
  // Validates `config` (dist::validate: core::ConfigError naming the field, e.g.
  // "dist.bucket_mb = 0: must lie in (0, 65536]").
  // `params` must be allocated, be identically laid out on every rank, outlive the object, and
  // keep all masters, or under ZeRO-1 exactly this rank's shard (MasterShard{rank, size}).
  // Under ZeRO-1 it keeps only this rank's shard of the masters afterwards.
  // The communicator is MPI's or NCCL's as config.backend and the device say, NCCL's
  // bootstrapped over MPI (dist/make_data_parallel.cpp, in mantissa_dist). A job of one rank
  // keeps its gradients in FP32, whatever config.grad_reduce_dtype and accumulate_fp32 say.
  static std::unique_ptr<DataParallel> create(World& world, core::Backend& backend,
                                              train::ParameterStore& params,
                                              const DistConfig& config);
  // The same over a communicator the caller made (config.backend is not consulted; the reduce
  // dtype is used as given, at any size): needs no MPI, e.g. NCCL at world size 1
  // (mantissa_dist_core). `comm`'s device must be the backend's. `host_scalars`, a host
  // communicator of the same ranks where `comm` is a device's, carries the scalar collectives
  // (create over a World gives NCCL one over MPI), which on the device would each wait for it.
  static std::unique_ptr<DataParallel> create(core::Backend& backend, train::ParameterStore& params,
                                              const DistConfig& config,
                                              std::unique_ptr<Communicator> comm,
                                              std::unique_ptr<Communicator> host_scalars = nullptr);

  // Makes every rank's weights the same. ZeRO-0: every rank's masters (and compute copy)
  // become rank 0's. ZeRO-1, where each master lives on one rank only: every rank rounds its
  // shard into the compute copy and the shards are all-gathered.
  virtual void broadcast_parameters() = 0;

  // Throws core::Error naming the ranks and what differs (step, loss-scaler state, FP8
  // scales, checksum of the FP32 masters) when the replicas disagree. Collective. Under
  // ZeRO-1 the masters are not replicated: the checksum covers the whole compute copy instead
  // ("checksum of the compute copy").
  virtual void check_consistency(const ReplicaState& state) = 0;
  // The host of each rank, by rank, which check_consistency's message names beside the ranks
  // (create over a World sets them).
  virtual void set_rank_hosts(std::vector<std::string> hosts_by_rank) = 0;

  // Sum over ranks (mean loss, tokens), bit-identical on every rank.
  double sum_across_ranks(double value) override = 0;

  // Communication of the last step, for metrics: the seconds this rank waited for
  // collectives that had not finished under the overlap (finish(), the ZeRO-1 all-gather),
  // and the payload bytes this rank handed to collectives.
  virtual double last_step_comm_seconds() const = 0;
  virtual int64_t last_step_comm_bytes() const = 0;

  // The optimizer for this configuration: train::LocalAdamW (ZeRO-0), or Zero1AdamW, AdamW over
  // this rank's shard of masters and moments whose step() and refresh_compute_copy() end with
  // the all-gather of the compute copy (ZeRO-1).
  virtual std::unique_ptr<train::Optimizer> make_optimizer(const core::AdamWConfig& config) = 0;

  // The gradient buckets as [begin, end) flat ranges, in the order they are reduced.
  virtual std::vector<std::pair<int64_t, int64_t>> buckets() const = 0;
  // The communicator for the Trainer's own collectives (ordered apart from the buckets): small
  // ones, and the all-gather of a replica whose parts the ranks read from a checkpoint.
  virtual Communicator& communicator() = 0;
};

}  // namespace mantissa::dist
