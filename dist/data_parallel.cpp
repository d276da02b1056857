// DataParallel: bucketed, overlapped gradient reduction over a Communicator, the scalar
// collectives of a step, the consistency check and the ZeRO-1 optimizer.
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
//   q = fp8_max / (N * amax),   amax = max over ranks and over the bucket of |g|,
// hence |sum of N codes| <= fp8_max at every hop. The result is widened with w = 1 / (N q).
//
// Ordering. MPI and NCCL need every rank to start the collectives of one communicator in the
// same order. A bucket's stage completes at a time that depends on the rank, so each stage
// posts on its own communicator. NCCL needs more: its kernels of different communicators,
// launched in different orders on different ranks, can wait on each other forever. So every
// collective of the pipeline is issued in one fixed order (order_, the same on every rank),
// each only after all those before it: when the next one cannot start yet, nothing after it
// starts either, and the rank goes back to backward and tries again at the next grad_ready
// (or in finish()).
// The scalar collectives on ctrl_ run only outside the pipeline (before grad_ready, after
// finish()), when none of its collectives is in flight.
//
// Progress. An MPI collective moves only inside MPI calls, so grad_ready() tests the
// requests in flight as well as starting new ones.
#include "dist/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::dist {

using core::DType;
using core::Shape;
using core::Tensor;
using Clock = std::chrono::steady_clock;

const char* reduce_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "FP32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "FP16";
    case DType::kE4M3: return "FP8_E4M3";
    case DType::kE5M2: return "FP8_E5M2";
    default: return core::dtype_name(dtype);
  }
}

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A 64-bit checksum of a buffer's bytes: the sum of a mixed function of each 8-byte word and
// its position, so it parallelises, and a changed, swapped or moved word changes it.
uint64_t checksum(const void* data, size_t nbytes) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const int64_t words = static_cast<int64_t>(nbytes / 8);
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    sum += core::mix64(w ^ core::mix64(static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ULL));
  }
  for (size_t i = static_cast<size_t>(words) * 8; i < nbytes; ++i) {
    sum += core::mix64(bytes[i] + (static_cast<uint64_t>(i) << 8));
  }
  return sum;
}

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
  // F32 [1] on the backend's device, a view of found_: this rank's non-finite check of the
  // bucket's gradients, before any cast.
  Tensor found;

  // Chunk r of the bucket is reduced by rank r (the whole bucket under plain ZeRO-0).
  std::vector<int64_t> counts;
  int64_t mine_offset = 0;  // my chunk, relative to the bucket
  int64_t mine = 0;

  Tensor grads;      // F32 view of the flat gradients [begin, end)
  Tensor low;        // the bucket in the reduce dtype (the F32 grads view itself for F32)
  Tensor recv;       // reduce_scatter: [mine]; all_to_all: [N * mine], in the reduce dtype
  Tensor sum;        // all_to_all: F32 [mine], the FP32 sum of the received chunks
  Tensor scratch;    // all_to_all with a reduced dtype: F32 [mine], one widened chunk
  Tensor amax_comm;  // FP8: F32 [1] on the communicator's device
  Tensor q, w;       // F32 [1] on the backend's device: pre-scale and widening scale
};

class DataParallelImpl;

// ZeRO-1: AdamW over this rank's shard of the masters (the only masters the parameter store
// keeps), moments only for the shard, and the compute copy of the other shards all-gathered
// after every update.
class ShardedAdamW final : public train::Optimizer {
 public:
  ShardedAdamW(DataParallelImpl& dp, const core::AdamWConfig& config);

  void step(train::ParameterStore& params, float lr, float grad_scale) override;
  void refresh_compute_copy(train::ParameterStore& params) override;
  int64_t owned_begin() const override { return begin_; }
  int64_t owned_end() const override { return end_; }
  Tensor& first_moment() override { return adamw_->first_moment(); }
  Tensor& second_moment() override { return adamw_->second_moment(); }
  int64_t steps_taken() const override { return adamw_->steps_taken(); }
  void set_steps_taken(int64_t steps) override { adamw_->set_steps_taken(steps); }

 private:
  void check_store(const train::ParameterStore& params) const;

  DataParallelImpl& dp_;
  int64_t begin_, end_;
  std::unique_ptr<core::AdamW> adamw_;
};

class DataParallelImpl final : public DataParallel {
 public:
  DataParallelImpl(core::Backend& backend, train::ParameterStore& params, const DistConfig& config,
                   std::unique_ptr<Communicator> comm)
      : backend_(backend), params_(params), config_(config), ctrl_(std::move(comm)) {
    amax_comm_ = ctrl_->duplicate();
    reduce_comm_ = ctrl_->duplicate();
    gather_comm_ = ctrl_->duplicate();
    const int n = ctrl_->size();
    // ZeRO-1 shards: contiguous, aligned, nearly equal (the store may be allocated with its
    // shard already, train::MasterShard, which never holds all masters at once).
    shard_counts_ = train::split_aligned(params_.flat_numel(), n);
    shard_offsets_ = chunk_offsets(shard_counts_);
    if (config_.zero_stage == 1) {
      // (A shard that is everything, as on one rank, needs no cut and no second copy.)
      if (params_.keeps_all_masters() && shard_end() - shard_begin() < params_.flat_numel()) {
        params_.keep_masters(backend_, shard_begin(), shard_end());
      }
      MANTISSA_CHECK(params_.masters_begin() == shard_begin() &&
                         params_.masters_begin() + params_.masters().numel() == shard_end(),
                     "DataParallel: rank "
                         << ctrl_->rank() << " of " << n << " owns the ZeRO-1 shard ["
                         << shard_begin() << ", " << shard_end()
                         << ") of the masters, but the parameter store keeps ["
                         << params_.masters_begin() << ", "
                         << params_.masters_begin() + params_.masters().numel() << ")");
    }
    build_buckets();
  }

  // --- GradientSync -------------------------------------------------------------------
  void grad_ready(int param) override {
    begin_step();
    if (!config_.overlap) return;
    MANTISSA_CHECK(param >= 0 && param < params_.size(),
                   "DataParallel::grad_ready: parameter " << param << " out of range");
    Bucket& b = buckets_[static_cast<size_t>(bucket_of_param_[static_cast<size_t>(param)])];
    if (!param_seen_[static_cast<size_t>(param)]) {
      param_seen_[static_cast<size_t>(param)] = true;
      ++b.params_ready;
    }
    advance();
  }

  bool finish(Tensor& grads) override {
    begin_step();
    MANTISSA_CHECK(grads.data() == params_.grads().data() && grads.numel() == params_.flat_numel(),
                   "DataParallel::finish: expects the parameter store's flat gradients, got "
                       << grads.describe());
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
    }
    const bool nonfinite = read_nonfinite_flags();
    for (Bucket& b : buckets_) {
      b.stage = Stage::kWaiting;
      b.params_ready = 0;
    }
    std::fill(param_seen_.begin(), param_seen_.end(), false);
    next_ = 0;
    comm_seconds_ += seconds_since(start);
    step_open_ = false;
    return nonfinite;
  }

  void max_across_ranks(std::vector<float>& values) override {
    if (values.empty()) return;
    // MPI's MAX may drop a NaN (every comparison with it is false): reduce it as +inf.
    for (float& v : values) v = std::isnan(v) ? INFINITY : v;
    Tensor host =
        Tensor::wrap(values.data(), Shape{static_cast<int64_t>(values.size())}, DType::kF32);
    Tensor buf = on_comm_device(host);
    timed_wait(ctrl_->all_reduce(buf, ReduceOp::kMax), buf.nbytes());
    from_comm_device(buf, host);
  }

  double sum_across_ranks(double value) override {
    // Gather every rank's value and add them in rank order, so that every rank holds the same
    // bits (an all-reduce may combine in a rank-dependent order).
    const int n = ctrl_->size();
    int64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    std::vector<int64_t> all(static_cast<size_t>(n));
    all_gather_host(&bits, all.data());
    double sum = 0.0;
    for (int64_t b : all) {
      double v;
      std::memcpy(&v, &b, sizeof v);
      sum += v;
    }
    return sum;
  }

  // --- DataParallel -------------------------------------------------------------------
  void broadcast_parameters() override {
    if (config_.zero_stage == 1) {
      refresh_compute_copy();
      return;
    }
    Tensor& masters = params_.masters();
    timed_wait(ctrl_->broadcast(masters, 0), masters.nbytes());
    params_.refresh_compute_copy(backend_);
    backend_.synchronize();
  }

  void check_consistency(const ReplicaState& state) override;

  double last_step_comm_seconds() const override { return comm_seconds_; }
  int64_t last_step_comm_bytes() const override { return comm_bytes_; }

  std::unique_ptr<train::Optimizer> make_optimizer(const core::AdamWConfig& config) override {
    if (config_.zero_stage == 0) {
      return std::make_unique<train::LocalAdamW>(backend_, params_, config);
    }
    return std::make_unique<ShardedAdamW>(*this, config);
  }

  std::vector<std::pair<int64_t, int64_t>> buckets() const override {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const Bucket& b : buckets_) out.emplace_back(b.begin, b.end);
    return out;
  }
  Communicator& communicator() override { return *ctrl_; }

  // --- for ShardedAdamW ---------------------------------------------------------------
  int64_t shard_begin() const { return shard_offsets_[static_cast<size_t>(ctrl_->rank())]; }
  int64_t shard_end() const { return shard_offsets_[static_cast<size_t>(ctrl_->rank()) + 1]; }
  core::Backend& backend() { return backend_; }
  train::ParameterStore& params() { return params_; }

  // Every rank rounds its shard of the masters into the compute copy, then the shards are
  // all-gathered.
  void refresh_compute_copy() {
    params_.refresh_compute_copy(backend_);
    gather_compute_copy();
  }

  // In place: every rank's shard of the compute copy to every rank.
  void gather_compute_copy() {
    Tensor& compute = params_.compute();
    const size_t me = static_cast<size_t>(ctrl_->rank());
    Tensor mine = compute.view(shard_offsets_[me], Shape{shard_counts_[me]});
    backend_.synchronize();  // the optimizer's writes to my shard are complete
    timed_wait(ctrl_->all_gather(mine, compute, shard_counts_), mine.nbytes());
  }

 private:
  void begin_step() {
    if (step_open_) return;
    step_open_ = true;
    comm_seconds_ = 0.0;
    comm_bytes_ = 0;
  }

  // Waits for a request from the main flow of the step, counting its time and bytes.
  void timed_wait(RequestPtr request, size_t bytes) {
    const auto start = Clock::now();
    request->wait();
    comm_seconds_ += seconds_since(start);
    comm_bytes_ += static_cast<int64_t>(bytes);
  }

  Tensor on_comm_device(const Tensor& host) {
    if (ctrl_->device().is_cpu()) return host;
    Tensor buf = Tensor::empty(host.shape(), host.dtype(), ctrl_->device());
    backend_.copy(host, buf);
    backend_.synchronize();
    return buf;
  }
  void from_comm_device(const Tensor& buf, Tensor& host) {
    if (buf.data() == host.data()) return;
    backend_.copy(buf, host);
    backend_.synchronize();
  }

  void all_gather_host(const int64_t* mine, int64_t* all) {
    const int n = ctrl_->size();
    Tensor host = Tensor::wrap(all, Shape{n}, DType::kI64);
    all[ctrl_->rank()] = *mine;
    Tensor buf = on_comm_device(host);
    Tensor slot = buf.view(ctrl_->rank(), Shape{1});
    timed_wait(ctrl_->all_gather(slot, buf, std::vector<int64_t>(static_cast<size_t>(n), 1)),
               sizeof(int64_t));
    from_comm_device(buf, host);
  }

  // The buckets' device-side non-finite checks, read in one copy once every reduction is
  // issued: reading each before its collective would stall the host, and with it the GPU, once
  // per bucket.
  bool read_nonfinite_flags() {
    std::vector<float> flags(buckets_.size());
    Tensor host =
        Tensor::wrap(flags.data(), Shape{static_cast<int64_t>(flags.size())}, DType::kF32);
    backend_.copy(found_, host);
    backend_.synchronize();
    // F32: unscale_check_finite's flag (1 = found); otherwise the bucket's amax (from the
    // cast, or for FP8 from start_amax).
    return std::any_of(flags.begin(), flags.end(),
                       [&](float f) { return fp32() ? f != 0.0f : !std::isfinite(f); });
  }

  float read_scalar(const Tensor& t) {
    float value = 0.0f;
    Tensor host = Tensor::wrap(&value, Shape{1}, DType::kF32);
    backend_.copy(t, host);
    backend_.synchronize();
    return value;
  }

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
  bool fp32() const { return config_.grad_reduce_dtype == DType::kF32; }

  core::Backend& backend_;
  train::ParameterStore& params_;
  DistConfig config_;
  std::unique_ptr<Communicator> ctrl_;  // scalars, broadcasts, the ZeRO-1 all-gather
  std::unique_ptr<Communicator> amax_comm_, reduce_comm_, gather_comm_;  // bucket stages
  std::vector<int64_t> shard_counts_, shard_offsets_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> order_;  // every collective of a step's pipeline, in the order issued
  size_t next_ = 0;          // order_[next_] is the next one to issue
  std::vector<int> bucket_of_param_;
  std::vector<bool> param_seen_;
  Tensor low_;    // the whole flat buffer in the reduce dtype; buckets view it
  Tensor found_;  // F32 [buckets] on the backend's device: each bucket's non-finite check
  bool step_open_ = false;
  double comm_seconds_ = 0.0;
  int64_t comm_bytes_ = 0;
};

void DataParallelImpl::build_buckets() {
  const int n = ctrl_->size();
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

  const size_t me = static_cast<size_t>(ctrl_->rank());
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
    if (config_.accumulate_fp32) {
      b.recv = Tensor::empty(Shape{n * b.mine}, dtype, device);
      b.sum = Tensor::empty(Shape{b.mine}, DType::kF32, device);
      if (!fp32()) b.scratch = Tensor::empty(Shape{b.mine}, DType::kF32, device);
    } else if (config_.zero_stage == 1) {
      b.recv = Tensor::empty(Shape{b.mine}, dtype, device);
    }
    if (fp8()) b.amax_comm = Tensor::empty(Shape{1}, DType::kF32, ctrl_->device());
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
void DataParallelImpl::build_order() {
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
// reduction with the rest of backward.)
bool DataParallelImpl::can_issue(const Slot& slot) const {
  const Bucket& b = buckets_[slot.bucket];
  switch (slot.stage) {
    case Stage::kAmax: return b.params_ready == b.params_total;
    case Stage::kReduce:
      return b.params_ready == b.params_total && (!fp8() || completed(b, Stage::kAmax)) &&
             previous_completed(slot.bucket, Stage::kReduce);
    case Stage::kGather:
      return completed(b, Stage::kReduce) && previous_completed(slot.bucket, Stage::kGather);
    case Stage::kWaiting:
    case Stage::kDone: break;  // not collectives
  }
  return false;
}

// Issues collectives in order_ as far as their inputs allow and finishes those that have
// completed, until neither moves; never waits for a collective.
void DataParallelImpl::advance() {
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

void DataParallelImpl::start_amax(Bucket& b) {
  // The amax is also this rank's non-finite check: inf or NaN anywhere makes it non-finite.
  backend_.amax(b.grads, b.found);
  float amax = read_scalar(b.found);
  if (std::isnan(amax)) amax = INFINITY;  // so that MAX cannot drop it
  Tensor host = Tensor::wrap(&amax, Shape{1}, DType::kF32);
  backend_.copy(host, b.amax_comm);
  backend_.synchronize();
  b.request = amax_comm_->all_reduce(b.amax_comm, ReduceOp::kMax);
  comm_bytes_ += sizeof(float);
  b.stage = Stage::kAmax;
}

void DataParallelImpl::start_reduce(Bucket& b) {
  const int n = ctrl_->size();
  double q = 1.0 / n;
  if (fp8()) {
    const float amax = read_scalar(b.amax_comm);
    // A non-finite amax (some rank overflowed: the step is skipped) or an all-zero bucket
    // keeps the plain average.
    if (std::isfinite(amax) && amax > 0.0f) {
      q = static_cast<double>(core::fp8_max(config_.grad_reduce_dtype)) /
          (n * static_cast<double>(amax));
    }
  }
  // The sum of the pre-scaled values is the average already, except for FP8's q.
  const double w = fp8() ? 1.0 / (n * static_cast<double>(static_cast<float>(q))) : 1.0;
  backend_.fill(b.q, static_cast<float>(q));
  backend_.fill(b.w, static_cast<float>(w));
  core::CastParams cast;
  cast.scale = &b.q;
  // The non-finite checks land in b.found, which finish() reads. The collective needs no
  // synchronize first: a communicator orders itself after the backend's queued work.
  if (fp32()) {
    // Pre-divide in place, fused with the non-finite check of the values before scaling.
    backend_.fill(b.found, 0.0f);
    backend_.unscale_check_finite(b.grads, static_cast<float>(q), b.found, nullptr);
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
  comm_bytes_ += static_cast<int64_t>(b.low.nbytes());
  b.stage = Stage::kReduce;
}

// recv holds N chunks (one per rank) of my part, in the reduce dtype: b.sum = their sum in
// FP32, added in rank order.
void DataParallelImpl::sum_received_chunks(Bucket& b) {
  const int n = ctrl_->size();
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
void DataParallelImpl::after_reduce(Bucket& b) {
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
void DataParallelImpl::start_gather(Bucket& b) {
  Tensor my_low = b.low.view(b.mine_offset, Shape{b.mine});
  b.request = gather_comm_->all_gather(my_low, b.low, b.counts);
  comm_bytes_ += static_cast<int64_t>(my_low.nbytes());
  b.stage = Stage::kGather;
}

void DataParallelImpl::after_gather(Bucket& b) {
  if (!fp32()) {
    core::CastParams widen;
    widen.scale = &b.w;
    backend_.cast(b.low, b.grads, widen);
  }
  b.stage = Stage::kDone;
}

// --- consistency check ------------------------------------------------------------------

struct Field {
  const char* name;
  bool hex;  // print as a bit pattern (checksums, float bits)
};

// The fixed record every rank contributes; index i of kFields names entry i.
constexpr Field kFields[] = {{"step", false},
                             {"loss-scaler scale (float bits)", true},
                             {"loss-scaler growth_tracker", false},
                             {"loss-scaler hysteresis_tracker", false},
                             {"loss-scaler overflows_at_min", false},
                             {"loss-scaler overflow_steps_total", false},
                             {"number of FP8 scales", false},
                             {"checksum of the FP8 scales", true},
                             {"optimizer steps", false},
                             {"checksum of the FP32 masters", true}};
constexpr size_t kNumFields = sizeof kFields / sizeof kFields[0];
// Under ZeRO-1 the last field covers the compute copy (see check_consistency).
constexpr const char* kZero1ReplicaField = "checksum of the compute copy";

void DataParallelImpl::check_consistency(const ReplicaState& state) {
  const int n = ctrl_->size();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &state.scaler.scale, sizeof scale_bits);
  // ZeRO-1 ranks keep different shards of the masters; their compute copies, all-gathered
  // from those shards, are the replicas (and the only whole copies of the weights).
  const bool zero1 = config_.zero_stage == 1;
  Tensor& replicated = zero1 ? params_.compute() : params_.masters();
  Tensor host = replicated;
  if (!replicated.device().is_cpu()) {
    host = Tensor::empty(replicated.shape(), replicated.dtype());
    backend_.copy(replicated, host);
  }
  backend_.synchronize();
  std::vector<int64_t> record = {
      state.step,
      scale_bits,
      state.scaler.growth_tracker,
      state.scaler.hysteresis_tracker,
      state.scaler.overflows_at_min,
      state.scaler.overflow_steps_total,
      static_cast<int64_t>(state.fp8_scales.size()),
      static_cast<int64_t>(checksum(state.fp8_scales.data(), state.fp8_scales.size() * 4)),
      state.optimizer_steps,
      static_cast<int64_t>(checksum(host.data(), host.nbytes()))};
  std::vector<int64_t> all(kNumFields * static_cast<size_t>(n));
  Tensor all_host = Tensor::wrap(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::kI64);
  std::copy(record.begin(), record.end(),
            all.begin() + static_cast<int64_t>(kNumFields) * ctrl_->rank());
  Tensor buf = on_comm_device(all_host);
  Tensor mine = buf.view(static_cast<int64_t>(kNumFields) * ctrl_->rank(), Shape{kNumFields});
  timed_wait(ctrl_->all_gather(mine, buf, std::vector<int64_t>(static_cast<size_t>(n), kNumFields)),
             mine.nbytes());
  from_comm_device(buf, all_host);

  // Every rank holds the same table, so every rank reaches the same verdict and message.
  std::ostringstream message;
  for (size_t f = 0; f < kNumFields; ++f) {
    std::vector<int> differ;
    const int64_t reference = all[f];
    for (int r = 1; r < n; ++r) {
      if (all[static_cast<size_t>(r) * kNumFields + f] != reference) differ.push_back(r);
    }
    if (differ.empty()) continue;
    const bool replica_field = f + 1 == kNumFields;
    message << "; " << (zero1 && replica_field ? kZero1ReplicaField : kFields[f].name)
            << ": rank 0 has ";
    const auto print = [&](int64_t v) {
      if (kFields[f].hex) {
        message << "0x" << std::hex << static_cast<uint64_t>(v) << std::dec;
      } else {
        message << v;
      }
    };
    print(reference);
    for (int r : differ) {
      message << ", rank " << r << " has ";
      print(all[static_cast<size_t>(r) * kNumFields + f]);
    }
  }
  MANTISSA_CHECK(message.str().empty(), "consistency check failed at step "
                                            << state.step << ": the replicas differ"
                                            << message.str());
}

// --- ZeRO-1 optimizer -------------------------------------------------------------------

ShardedAdamW::ShardedAdamW(DataParallelImpl& dp, const core::AdamWConfig& config)
    : dp_(dp), begin_(dp.shard_begin()), end_(dp.shard_end()) {
  // The parameter ranges clipped to the shard, relative to its first element.
  std::vector<core::ParamRange> ranges;
  for (const core::ParamRange& r : train::adamw_ranges(dp.params())) {
    const int64_t lo = std::max(r.offset, begin_);
    const int64_t hi = std::min(r.offset + r.numel, end_);
    if (hi > lo) ranges.push_back({lo - begin_, hi - lo, r.weight_decay});
  }
  adamw_ = std::make_unique<core::AdamW>(dp.backend(), std::move(ranges), end_ - begin_, config);
}

void ShardedAdamW::step(train::ParameterStore& params, float lr, float grad_scale) {
  check_store(params);
  const Shape shape{end_ - begin_};
  Tensor grads = params.grads().view(begin_, shape);
  Tensor compute = params.compute().view(begin_, shape);
  adamw_->step(dp_.backend(), params.masters(), grads, &compute, lr, grad_scale);
  dp_.gather_compute_copy();
}

void ShardedAdamW::refresh_compute_copy(train::ParameterStore& params) {
  check_store(params);
  dp_.refresh_compute_copy();
}

void ShardedAdamW::check_store(const train::ParameterStore& params) const {
  MANTISSA_CHECK(params.masters_begin() == begin_ && params.masters().numel() == end_ - begin_,
                 "ZeRO-1 optimizer of the shard ["
                     << begin_ << ", " << end_ << "): the parameter store keeps the masters ["
                     << params.masters_begin() << ", "
                     << params.masters_begin() + params.masters().numel() << ")");
}

}  // namespace

std::unique_ptr<DataParallel> DataParallel::create(core::Backend& backend,
                                                   train::ParameterStore& params,
                                                   const DistConfig& config,
                                                   std::unique_ptr<Communicator> comm) {
  const DType d = config.grad_reduce_dtype;
  MANTISSA_CHECK(d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kE4M3 ||
                     d == DType::kE5M2,
                 "dist.grad_reduce_dtype must be FP32, BF16, FP16, FP8_E4M3 or FP8_E5M2, got "
                     << core::dtype_name(d));
  MANTISSA_CHECK(config.bucket_mb > 0, "dist.bucket_mb must be > 0, got " << config.bucket_mb);
  MANTISSA_CHECK(config.zero_stage == 0 || config.zero_stage == 1,
                 "dist.zero_stage must be 0 or 1, got " << config.zero_stage);
  MANTISSA_CHECK(config.timeout_s > 0, "dist.timeout_s must be > 0, got " << config.timeout_s);
  MANTISSA_CHECK(
      config.consistency_check_every >= 0,
      "dist.consistency_check_every must be >= 0, got " << config.consistency_check_every);
  MANTISSA_CHECK(params.flat_numel() > 0 && params.masters().defined(),
                 "DataParallel::create: the parameter store is not allocated");
  if (config.zero_stage == 0)
    params.require_all_masters("DataParallel::create (dist.zero_stage 0)");
  MANTISSA_CHECK(
      comm != nullptr && comm->device() == backend.device(),
      "DataParallel::create: the communicator's buffers must live on " << backend.device().str());
  return std::make_unique<DataParallelImpl>(backend, params, config, std::move(comm));
}

}  // namespace mantissa::dist
