// BucketedGradSync: bucketed, overlapped gradient reduction over a Communicator.
//
// A bucket is a contiguous range of the flat gradient buffer (parameters are laid out in
// registration order, and buckets are filled in reverse order, so the first bucket holds the
// last layers, whose gradients backward produces first). Each bucket moves through stages:
//
//   kWaiting  until every parameter in it has reported grad_ready (or finish() is called);
//   kAmax     FP8 only: the bucket's local amax (which is also its non-finite check) is
//             MAX-reduced, so all ranks derive the same shared scale;
//   kReduce   the local non-finite check and the cast to the reduce dtype with the
//             pre-scale q, then one of
//               all_reduce       (ZeRO-0)
//               reduce_scatter   (ZeRO-1)
//               all_to_all       (accumulate_fp32: each rank receives every rank's copy of
//                                 its chunk and sums them in FP32 itself, in rank order)
//   kGather   accumulate_fp32 under ZeRO-0: the summed chunks are rounded once to the reduce
//             dtype and all-gathered;
//   kDone     the average is back in the FP32 gradients (all of the bucket, or this rank's
//             shard of it).
//
// Pre-scaling. Every rank multiplies its gradients by q before the sum, so the sum is already
// the average (q = 1/N) or, for FP8, fills the format without overflowing:
//   q = min(fp8_max / (N * amax), 2^(126 - ceil(log2 N))),
//   amax = max over ranks and over the bucket of |g|,
// hence the exact sum of the N scaled gradients is at most fp8_max. Rounding each code (and,
// in a ring, each hop's partial sum) to nearest can still carry an FP8 sum past fp8_max
// (E4M3, 13 ranks: codes of 34.46 round to 36, summing to 468 > 448); it then
// saturates at fp8_max, since both FP8 sums (the MPI operator and NCCL's) convert with
// SATFINITE, never to NaN or inf. The result is widened with w = 1 / (N q).
// The cap binds only for a tiny amax (below about fp8_max * 2^-126: 5e-36 for E4M3, 7e-34 for
// E5M2). Without it q would overflow FP32 to +inf, the zeros of the bucket (its padding at
// least) would become 0 * inf = NaN, and the averages NaN, which the non-finite check (the
// finite amax) does not see. At the cap q is a power of two and w = 1 / (N q) >= 2^-126 a
// normal FP32 number; the codes fill less of the format, so that values below s / q (s: half
// the smallest FP8 subnormal) round to 0.
//
// Ordering. MPI and NCCL need every rank to start the collectives of one communicator in the
// same order. A bucket's stage completes at a time that depends on the rank, so each stage
// posts on its own communicator. NCCL needs more: its kernels of different communicators,
// launched in different orders on different ranks, can wait on each other forever. So every
// collective of the pipeline is issued in one fixed order (order_, the same on every rank),
// each only after all those before it (and NCCL's communicators run them on the GPU in that
// order, dist/nccl/nccl_communicator.h): when the next one cannot start yet, nothing after it
// starts either, and the rank goes back to backward and tries again at the next grad_ready
// (or in finish()).
// The scalar collectives (on the control communicator, or on StepComm's host one beside NCCL)
// run only outside the pipeline (before grad_ready, after finish()), when none of its
// collectives is in flight.
//
// Progress. An MPI collective moves only inside MPI calls, so grad_ready() tests the
// requests in flight as well as starting new ones.
#include "dist/bucketed_grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/precision/fp8_scale.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::dist {

using core::DType;
using core::Shape;
using core::Tensor;
using Clock = std::chrono::steady_clock;

ReduceScales reduce_scales(DType reduce_dtype, int world_size, float amax) {
  if (!core::is_fp8(reduce_dtype)) return {static_cast<float>(1.0 / world_size), 1.0f};
  // A non-finite amax (some rank overflowed: the step is skipped) or an all-zero bucket keeps
  // the plain average (core/precision/fp8_scale.h, the rule the device applies too).
  const core::Fp8ReduceScales s =
      core::fp8_reduce_scales_for(amax, core::fp8_max(reduce_dtype), world_size);
  return {s.q, s.w};
}

BucketedGradSync::BucketedGradSync(core::Backend& backend, train::ParameterStore& params,
                                   const DistConfig& config, StepComm& comm,
                                   std::vector<int64_t> shard_offsets)
    : backend_(backend),
      params_(params),
      config_(config),
      comm_(comm),
      amax_comm_(comm.ctrl().duplicate()),
      reduce_comm_(comm.ctrl().duplicate()),
      gather_comm_(comm.ctrl().duplicate()),
      shard_offsets_(std::move(shard_offsets)) {
  MANTISSA_CHECK(
      config_.zero_stage == 0 || shard_offsets_.size() == static_cast<size_t>(comm_.size()) + 1,
      "BucketedGradSync: ZeRO-1 needs the " << comm_.size() + 1 << " shard boundaries, got "
                                            << shard_offsets_.size());
  build_buckets();
}

void BucketedGradSync::grad_ready(int param) {
  comm_.open_step();
  if (!config_.overlap || alone_in_fp32()) return;
  MANTISSA_CHECK(param >= 0 && param < params_.size(),
                 "DataParallel::grad_ready: parameter " << param << " out of range");
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_param_[static_cast<size_t>(param)])];
  if (!param_seen_[static_cast<size_t>(param)]) {
    param_seen_[static_cast<size_t>(param)] = true;
    ++b.params_ready;
  }
  advance();
}

void BucketedGradSync::finish(Tensor& grads, Tensor& check) {
  comm_.open_step();
  MANTISSA_CHECK(grads.data() == params_.grads().data() && grads.numel() == params_.flat_numel(),
                 "DataParallel::finish: expects the parameter store's flat gradients, got "
                     << grads.describe());
  if (alone_in_fp32()) {
    backend_.fill(check, 0.0f);  // no cast to hide a non-finite value: the step's check sees it
    comm_.close_step();
    return;
  }
  const auto start = Clock::now();
  for (Bucket& b : buckets_) b.params_ready = b.params_total;  // unreported ones too
  advance();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    while (b.stage != Stage::kDone) {
      // With every bucket ready, only a collective in flight can hold up the first
      // unfinished bucket (see can_issue).
      MANTISSA_CHECK(b.request, "DataParallel::finish: bucket " << i << " is stuck");
      b.request->wait();
      advance();
    }
    if (b.amax_request) {
      b.amax_request->wait();
      b.amax_request.reset();
    }
  }
  // One check of every bucket's, on the device: F32 buckets flag 1 for a non-finite value (0
  // otherwise), the others hold their amax, non-finite then. Reading each bucket's before its
  // collective would stall the host, and with it the GPU, once per bucket.
  backend_.amax(found_, check);
  for (Bucket& b : buckets_) {
    b.stage = Stage::kWaiting;
    b.params_ready = 0;
  }
  std::fill(param_seen_.begin(), param_seen_.end(), false);
  next_ = 0;
  comm_.add_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  comm_.close_step();
}

bool BucketedGradSync::saw_nonfinite(float check) const {
  return fp32() ? check != 0.0f : !std::isfinite(check);
}

std::vector<std::pair<int64_t, int64_t>> BucketedGradSync::buckets() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Bucket& b : buckets_) out.emplace_back(b.begin, b.end);
  return out;
}

void BucketedGradSync::build_buckets() {
  const int n = comm_.size();
  const int64_t flat = params_.flat_numel();
  const int64_t cap = std::max<int64_t>(
      1, static_cast<int64_t>(config_.bucket_mb * 1024.0 * 1024.0 / sizeof(float)));
  const core::Device device = backend_.device();
  if (!fp32()) low_ = Tensor::empty(Shape{flat}, config_.grad_reduce_dtype, device);
  bucket_of_param_.assign(static_cast<size_t>(params_.size()), -1);
  param_seen_.assign(static_cast<size_t>(params_.size()), false);

  // Parameter i owns the slot [offset_i, offset_{i+1}) (its padding included), so buckets
  // of consecutive parameters tile the flat buffer.
  int64_t end = flat;
  for (int i = params_.size() - 1; i >= 0; --i) {
    const int64_t slot_begin = params_[i].offset;
    if (buckets_.empty() ||
        (buckets_.back().end - slot_begin > cap && buckets_.back().params_total > 0)) {
      Bucket b;
      b.end = end;
      buckets_.push_back(std::move(b));
    }
    Bucket& b = buckets_.back();
    b.begin = slot_begin;
    ++b.params_total;
    bucket_of_param_[static_cast<size_t>(i)] = static_cast<int>(buckets_.size()) - 1;
    end = slot_begin;
  }
  MANTISSA_CHECK(!buckets_.empty() && buckets_.back().begin == 0,
                 "DataParallel: the parameter store has no parameters at offset 0");
  build_order();

  const size_t me = static_cast<size_t>(comm_.rank());
  found_ = Tensor::empty(Shape{static_cast<int64_t>(buckets_.size())}, DType::kF32, device);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    b.found = found_.view(static_cast<int64_t>(i), Shape{1});
    const int64_t numel = b.end - b.begin;
    b.grads = params_.grads().view(b.begin, Shape{numel});
    b.low = fp32() ? b.grads : low_.view(b.begin, Shape{numel});
    if (config_.zero_stage == 1) {
      // Chunk r = the part of the bucket inside shard r.
      for (int r = 0; r < n; ++r) {
        const int64_t lo = std::clamp(shard_offsets_[static_cast<size_t>(r)], b.begin, b.end);
        const int64_t hi = std::clamp(shard_offsets_[static_cast<size_t>(r) + 1], b.begin, b.end);
        b.counts.push_back(hi - lo);
      }
    } else if (config_.accumulate_fp32) {
      b.counts = train::split_aligned(numel, n);
    } else {
      b.counts.assign(static_cast<size_t>(n), 0);
      b.counts[me] = numel;  // unused by all_reduce; "mine" is the whole bucket
    }
    b.mine_offset = chunk_offsets(b.counts)[me];
    b.mine = b.counts[me];
    if (config_.zero_stage == 0 && !config_.accumulate_fp32) b.mine_offset = 0;
    const DType dtype = config_.grad_reduce_dtype;
    if (config_.accumulate_fp32 && !alone_in_fp32()) {
      b.recv = Tensor::empty(Shape{n * b.mine}, dtype, device);
      b.sum = Tensor::empty(Shape{b.mine}, DType::kF32, device);
      if (!fp32()) b.scratch = Tensor::empty(Shape{b.mine}, DType::kF32, device);
    } else if (config_.zero_stage == 1 && !alone_in_fp32()) {
      b.recv = Tensor::empty(Shape{b.mine}, dtype, device);
    }
    if (fp8()) b.amax_comm = Tensor::empty(Shape{1}, DType::kF32, comm_.ctrl().device());
    b.q = Tensor::empty(Shape{1}, DType::kF32, device);
    b.w = Tensor::empty(Shape{1}, DType::kF32, device);
  }
}

// The order in which every rank issues the pipeline's collectives. The amax of bucket b + 1
// comes right after the reduction of b, so it completes while that reduction runs and the
// reduction of b + 1 can start as soon as b's has (the reductions are the long collectives
// that bound the pipeline when communication is the bottleneck). The all-gather of b comes
// after them: it waits for bucket b + 1 to be ready (for its amax), which costs nothing when
// communication is the bottleneck, since backward has then finished the buckets long before
// their turn.
void BucketedGradSync::build_order() {
  const bool gather = config_.accumulate_fp32 && config_.zero_stage == 0;
  if (fp8()) order_.push_back({Stage::kAmax, 0});
  for (size_t b = 0; b < buckets_.size(); ++b) {
    order_.push_back({Stage::kReduce, b});
    if (fp8() && b + 1 < buckets_.size()) order_.push_back({Stage::kAmax, b + 1});
    if (gather) order_.push_back({Stage::kGather, b});
  }
}

// Whether a collective's inputs are ready. A bucket starts its reduction only when the
// previous bucket's has completed, and its all-gather only after the previous bucket's: one
// large collective per stage in flight. (Several concurrent 25 MiB collectives interleave
// their fragments and run far slower than the same ones in turn; this still overlaps each
// reduction with the rest of backward.) A communicator that runs its collectives in order
// (NCCL's stream) keeps one in flight by itself: there a reduction starts as soon as its
// bucket is ready, without the host seeing the previous one complete, which on a GPU it would
// only see once the GPU had caught up with the host, after backward. For the same reason an FP8
// reduction there starts while its amax is in flight: the backend's stream, which derives the
// scales from the amax, waits for that collective on the GPU (Request::order_backend_after).
bool BucketedGradSync::can_issue(const Slot& slot) const {
  const Bucket& b = buckets_[slot.bucket];
  switch (slot.stage) {
    case Stage::kAmax: return b.params_ready == b.params_total;
    case Stage::kReduce:
      return b.params_ready == b.params_total &&
             (!fp8() || completed(b, Stage::kAmax) || amax_comm_->runs_in_order()) &&
             (reduce_comm_->runs_in_order() || previous_completed(slot.bucket, Stage::kReduce));
    case Stage::kGather:
      return completed(b, Stage::kReduce) &&
             (gather_comm_->runs_in_order() || previous_completed(slot.bucket, Stage::kGather));
    case Stage::kWaiting:
    case Stage::kDone: break;  // not collectives
  }
  return false;
}

// Issues collectives in order_ as far as their inputs allow and finishes those that have
// completed, until neither moves; never waits for a collective.
void BucketedGradSync::advance() {
  for (bool moved = true; moved;) {
    while (next_ < order_.size() && can_issue(order_[next_])) {
      const Slot& slot = order_[next_++];
      Bucket& b = buckets_[slot.bucket];
      switch (slot.stage) {
        case Stage::kAmax: start_amax(b); break;
        case Stage::kReduce: start_reduce(b); break;
        case Stage::kGather: start_gather(b); break;
        case Stage::kWaiting:
        case Stage::kDone: break;  // not collectives
      }
    }
    moved = false;
    for (Bucket& b : buckets_) {
      if (b.amax_request && b.amax_request->test()) b.amax_request.reset();
      if (!b.request || !b.request->test()) continue;
      b.request.reset();
      switch (b.stage) {
        case Stage::kReduce: after_reduce(b); break;
        case Stage::kGather: after_gather(b); break;
        default: break;  // an amax: start_reduce reads it
      }
      moved = true;
    }
  }
}

void BucketedGradSync::start_amax(Bucket& b) {
  // The amax is also this rank's non-finite check: inf or NaN anywhere makes it non-finite.
  // It goes to the collective as it is, device to device, with no host round trip. A float
  // MAX may drop a NaN (Open MPI does when the NaN comes from the last rank), but every rank
  // receives the same result, so the ranks still derive the same scales and the same sums
  // (test_grad_sync's ANonFiniteStepStillGivesEveryRankTheSameBits); the step is skipped
  // anyway: finish() folds each rank's own check into the scalar the training step reads back
  // and MAX-reduces.
  backend_.amax(b.grads, b.found);
  backend_.copy(b.found, b.amax_comm);
  b.request = amax_comm_->all_reduce(b.amax_comm, ReduceOp::kMax);
  comm_.add_bytes(sizeof(float));
  b.stage = Stage::kAmax;
}

void BucketedGradSync::start_reduce(Bucket& b) {
  const int n = comm_.size();
  // The sum of the pre-scaled values is the average already, except for FP8, where w undoes q
  // (both derived on the device from the reduced amax).
  const ReduceScales scales = reduce_scales(config_.grad_reduce_dtype, n, 0.0f);
  if (fp8()) {
    if (b.request) {  // the amax, in flight on a communicator that runs in order (can_issue)
      b.request->order_backend_after();
      b.amax_request = std::move(b.request);
    }
    backend_.fp8_reduce_scales(b.amax_comm, core::fp8_max(config_.grad_reduce_dtype), n, b.q, b.w);
  } else {
    backend_.fill(b.q, scales.q);
    backend_.fill(b.w, scales.w);
  }
  core::CastParams cast;
  cast.scale = &b.q;
  // The non-finite checks land in b.found, which finish() folds. The collective needs no
  // synchronize first: a communicator orders itself after the backend's queued work.
  if (fp32()) {
    // Pre-divide in place, fused with the non-finite check of the values before scaling.
    backend_.fill(b.found, 0.0f);
    backend_.unscale_check_finite(b.grads, scales.q, b.found, nullptr);
  } else if (fp8()) {
    backend_.cast(b.grads, b.low, cast);  // b.found holds the amax, i.e. the check
  } else {
    cast.amax = &b.found;  // max |g| before the cast: the non-finite check in the same pass
    backend_.cast(b.grads, b.low, cast);
  }
  if (config_.accumulate_fp32) {
    b.request = reduce_comm_->all_to_all(b.low, b.counts, b.recv,
                                         std::vector<int64_t>(static_cast<size_t>(n), b.mine));
  } else if (config_.zero_stage == 1) {
    b.request = reduce_comm_->reduce_scatter(b.low, b.recv, b.counts, ReduceOp::kSum);
  } else {
    b.request = reduce_comm_->all_reduce(b.low, ReduceOp::kSum);
  }
  comm_.add_bytes(static_cast<int64_t>(b.low.nbytes()));
  b.stage = Stage::kReduce;
}

// recv holds N chunks (one per rank) of my part, in the reduce dtype: b.sum = their sum in
// FP32, added in rank order.
void BucketedGradSync::sum_received_chunks(Bucket& b) {
  const int n = comm_.size();
  for (int r = 0; r < n; ++r) {
    Tensor chunk = b.recv.view(r * b.mine, Shape{b.mine});
    if (!fp32()) {
      backend_.cast(chunk, b.scratch, core::CastParams{});  // exact: FP32 holds every code
      chunk = b.scratch;
    }
    if (r == 0) {
      backend_.copy(chunk, b.sum);
    } else {
      backend_.add(b.sum, chunk, b.sum);
    }
  }
}

// The reduction of `b` has completed: its results go back to the FP32 gradients, or, before
// the all-gather, my summed chunk is rounded once into the reduce dtype.
void BucketedGradSync::after_reduce(Bucket& b) {
  core::CastParams widen;
  widen.scale = &b.w;
  Tensor my_grads = b.grads.view(b.mine_offset, Shape{b.mine});
  if (config_.accumulate_fp32) {
    if (b.mine > 0) sum_received_chunks(b);
    if (config_.zero_stage == 1) {
      if (b.mine > 0) backend_.cast(b.sum, my_grads, widen);
      b.stage = Stage::kDone;
      return;
    }
    Tensor my_low = b.low.view(b.mine_offset, Shape{b.mine});
    if (b.mine > 0) backend_.cast(b.sum, my_low, core::CastParams{});
    return;  // the all-gather is issued in its turn
  }
  if (config_.zero_stage == 1) {
    if (b.mine > 0) backend_.cast(b.recv, my_grads, widen);
  } else if (!fp32()) {
    backend_.cast(b.low, b.grads, widen);
  }
  b.stage = Stage::kDone;
}

// Shares my summed chunk of `b` (after_reduce rounded it).
void BucketedGradSync::start_gather(Bucket& b) {
  Tensor my_low = b.low.view(b.mine_offset, Shape{b.mine});
  b.request = gather_comm_->all_gather(my_low, b.low, b.counts);
  comm_.add_bytes(static_cast<int64_t>(my_low.nbytes()));
  b.stage = Stage::kGather;
}

void BucketedGradSync::after_gather(Bucket& b) {
  if (!fp32()) {
    core::CastParams widen;
    widen.scale = &b.w;
    backend_.cast(b.low, b.grads, widen);
  }
  b.stage = Stage::kDone;
}

}  // namespace mantissa::dist
