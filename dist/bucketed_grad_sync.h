// The gradient synchronisation of data parallelism: bucketed, overlapped with backward,
// in a reduced-precision dtype, with one non-finite check before any cast (the algorithm and
// its ordering rules are described in bucketed_grad_sync.cpp).
//
// It is the train::GradientSync of a data-parallel step: grad_ready() starts the reductions of
// the buckets backward has completed, finish() waits for the rest and leaves the average over
// ranks in the FP32 gradients (all of them, or under ZeRO-1 this rank's shard), and the scalar
// collectives run on StepComm's (dist/step_comm.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/ops/backend.h"
#include "dist/communicator.h"
#include "dist/dist_config.h"
#include "dist/step_comm.h"
#include "train/gradient_sync.h"
#include "train/parameters.h"

namespace mantissa::dist {

// A bucket's pre-scale q (gradients are cast to the reduce dtype as round(g q)) and widening
// scale w (the sum of the codes times w is the average), as the FP32 values the casts use:
// q = 1/N and w = 1, or for FP8 q = min(fp8_max / (N amax), 2^(126 - ceil(log2 N))) and
// w = 1 / (N q), with `amax` the bucket's amax, MAX-reduced over ranks (q = 1/N when it is 0 or
// not finite). Computed in double and rounded once; the derivation is in bucketed_grad_sync.cpp.
struct ReduceScales {
  float q;
  float w;
};
ReduceScales reduce_scales(core::DType reduce_dtype, int world_size, float amax);

class BucketedGradSync final : public train::GradientSync {
 public:
  // `config` must be valid (dist::validate); `params`, `backend` and `comm` must outlive the
  // object. Under ZeRO-1, `shard_offsets` are the N + 1 boundaries of the ranks' shards
  // (Zero1Shard::offsets()): each rank receives the average over its own shard only; unused
  // otherwise. Makes one duplicate of the control communicator per pipeline stage.
  BucketedGradSync(core::Backend& backend, train::ParameterStore& params, const DistConfig& config,
                   StepComm& comm, std::vector<int64_t> shard_offsets);

  void grad_ready(int param) override;
  void finish(core::Tensor& grads, core::Tensor& check) override;
  bool saw_nonfinite(float check) const override;
  void max_across_ranks(std::vector<float>& values) override { comm_.max_across_ranks(values); }
  double sum_across_ranks(double value) override { return comm_.sum_across_ranks(value); }

  // The gradient buckets as [begin, end) flat ranges, in the order they are reduced.
  std::vector<std::pair<int64_t, int64_t>> buckets() const;

 private:
  enum class Stage { kWaiting, kAmax, kReduce, kGather, kDone };

  // One collective of the pipeline: the `stage` of bucket `bucket`.
  struct Slot {
    Stage stage;
    size_t bucket;
  };

  struct Bucket {
    int64_t begin = 0, end = 0;  // flat range
    int params_total = 0;
    int params_ready = 0;
    Stage stage = Stage::kWaiting;  // the last collective issued (kDone once all are complete)
    RequestPtr request;             // that collective, while in flight
    // FP8 on a communicator that runs in order: the amax collective, still in flight when the
    // reduction that reads it was issued (the backend was ordered after it), until it completes.
    RequestPtr amax_request;
    // F32 [1] on the backend's device, a view of found_: this rank's non-finite check of the
    // bucket's gradients, before any cast.
    core::Tensor found;

    // Chunk r of the bucket is reduced by rank r (the whole bucket under plain ZeRO-0).
    std::vector<int64_t> counts;
    int64_t mine_offset = 0;  // my chunk, relative to the bucket
    int64_t mine = 0;

    core::Tensor grads;      // F32 view of the flat gradients [begin, end)
    core::Tensor low;        // the bucket in the reduce dtype (the F32 grads view itself for F32)
    core::Tensor recv;       // reduce_scatter: [mine]; all_to_all: [N * mine], in the reduce dtype
    core::Tensor sum;        // all_to_all: F32 [mine], the FP32 sum of the received chunks
    core::Tensor scratch;    // all_to_all with a reduced dtype: F32 [mine], one widened chunk
    core::Tensor amax_comm;  // FP8: F32 [1] on the communicator's device
    core::Tensor q, w;       // F32 [1] on the backend's device: pre-scale and widening scale
  };

  void build_buckets();
  void build_order();
  void advance();
  bool can_issue(const Slot& slot) const;
  static bool completed(const Bucket& b, Stage stage) {
    return b.stage > stage || (b.stage == stage && !b.request);
  }
  // Whether the bucket before `index` has completed `stage` (true for the first bucket).
  bool previous_completed(size_t index, Stage stage) const {
    return index == 0 || completed(buckets_[index - 1], stage);
  }
  void start_amax(Bucket& b);
  void start_reduce(Bucket& b);
  void after_reduce(Bucket& b);
  void start_gather(Bucket& b);
  void after_gather(Bucket& b);
  void sum_received_chunks(Bucket& b);

  bool fp8() const { return core::is_fp8(config_.grad_reduce_dtype); }
  bool fp32() const { return config_.grad_reduce_dtype == core::DType::kF32; }
  // One rank reducing in FP32: its gradients are their own average, and no collective, receive
  // buffer or pass over them is needed (on one GPU each bucket would wait for the host). In
  // another dtype a rank alone still rounds through it, as configured.
  bool alone_in_fp32() const { return comm_.size() == 1 && fp32(); }

  core::Backend& backend_;
  train::ParameterStore& params_;
  DistConfig config_;
  StepComm& comm_;  // the control communicator, and the step's accounting
  std::unique_ptr<Communicator> amax_comm_, reduce_comm_, gather_comm_;  // bucket stages
  std::vector<int64_t> shard_offsets_;                                   // ZeRO-1
  std::vector<Bucket> buckets_;
  std::vector<Slot> order_;  // every collective of a step's pipeline, in the order issued
  size_t next_ = 0;          // order_[next_] is the next one to issue
  std::vector<int> bucket_of_param_;
  std::vector<bool> param_seen_;
  core::Tensor low_;    // the whole flat buffer in the reduce dtype; buckets view it
  core::Tensor found_;  // F32 [buckets] on the backend's device: each bucket's non-finite check
};

}  // namespace mantissa::dist
