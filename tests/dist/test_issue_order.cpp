// Every rank must issue the collectives of DataParallel's gradient pipeline in the same order,
// whatever its timing: NCCL kernels of different communicators, launched in different orders
// on different ranks, can wait on each other forever (MPI does not mind, so only the order
// itself can be checked here). A recording Communicator, whose duplicates all write to one
// log, sees every collective DataParallel issues on any of its communicators. One rank at a
// time runs backward slowly on purpose, so that its collectives complete at other points of
// backward than on the other ranks; afterwards every rank's log must equal rank 0's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/data_parallel.h"
#include "dist/mpi/mpi_communicator.h"
#include "tests/dist/dist_test.h"
#include "tests/dist/sync_case.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using testing::describe;
using testing::finish_saw_nonfinite;
using testing::make_sync_store;
using testing::sync_config;
using testing::SyncCase;

constexpr double kTimeout = 60.0;

enum class Kind : int64_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kBarrier
};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllGather: return "all_gather";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kBarrier: return "barrier";
  }
  return "?";
}

// One collective as issued: what, on which communicator (0 is the original, then its
// duplicates in the order they were made), and the dtype and size of the buffer that is the
// same on every rank (the input, but the output of an all-gather).
struct Call {
  Kind kind;
  int64_t comm;
  DType dtype;
  int64_t numel;
};
constexpr size_t kWordsPerCall = 4;

struct Log {
  std::vector<Call> calls;
  int64_t communicators = 0;
};

std::string describe(const Call& c) {
  std::ostringstream out;
  out << kind_name(c.kind) << " of " << c.numel << " " << core::dtype_name(c.dtype)
      << " on communicator " << c.comm;
  return out.str();
}

// Records every collective, then forwards it to `inner`.
class RecordingCommunicator final : public Communicator {
 public:
  // `in_order`: reports runs_in_order() as NCCL's communicators do, so that the pipeline
  // starts a bucket's collective before the previous one has completed (MPI, underneath, lets
  // them progress together).
  RecordingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<Log> log,
                        bool in_order = false)
      : inner_(std::move(inner)),
        log_(std::move(log)),
        id_(log_->communicators++),
        in_order_(in_order) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  core::Device device() const override { return inner_->device(); }
  bool runs_in_order() const override { return in_order_; }
  std::unique_ptr<Communicator> duplicate() override {
    return std::make_unique<RecordingCommunicator>(inner_->duplicate(), log_, in_order_);
  }

  RequestPtr all_reduce(Tensor& buf, ReduceOp op) override {
    record(Kind::kAllReduce, buf);
    return inner_->all_reduce(buf, op);
  }
  RequestPtr reduce_scatter(const Tensor& send, Tensor& recv, const std::vector<int64_t>& counts,
                            ReduceOp op) override {
    record(Kind::kReduceScatter, send);
    return inner_->reduce_scatter(send, recv, counts, op);
  }
  RequestPtr all_gather(const Tensor& send, Tensor& recv,
                        const std::vector<int64_t>& counts) override {
    record(Kind::kAllGather, recv);
    return inner_->all_gather(send, recv, counts);
  }
  RequestPtr broadcast(Tensor& buf, int root) override {
    record(Kind::kBroadcast, buf);
    return inner_->broadcast(buf, root);
  }
  RequestPtr all_to_all(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                        const std::vector<int64_t>& recv_counts) override {
    record(Kind::kAllToAll, send);
    return inner_->all_to_all(send, send_counts, recv, recv_counts);
  }
  void barrier() override {
    log_->calls.push_back({Kind::kBarrier, id_, DType::kF32, 0});
    inner_->barrier();
  }

 private:
  void record(Kind kind, const Tensor& buf) {
    log_->calls.push_back({kind, id_, buf.dtype(), buf.numel()});
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<Log> log_;
  int64_t id_;
  bool in_order_;
};

class IssueOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = core::make_cpu_backend();
    n = testing::world().size();
    me = testing::world().rank();
  }

  // Runs `steps` steps of gradient sync, rank (step % n) sleeping before every grad_ready;
  // returns the collectives this rank issued. `in_order`: over communicators that report running
  // their collectives in order, as NCCL's do.
  std::vector<Call> run_steps(const SyncCase& c, int steps, bool in_order) {
    auto log = std::make_shared<Log>();
    train::ParameterStore params = make_sync_store(*backend);
    DistConfig config;
    config.timeout_s = kTimeout;
    config = sync_config(c, config);
    auto dp =
        DataParallel::create(*backend, params, config,
                             std::make_unique<RecordingCommunicator>(
                                 make_mpi_communicator(testing::world(), kTimeout), log, in_order));
    const size_t buckets = dp->buckets().size();
    for (int step = 0; step < steps; ++step) {
      backend->fill(params.grads(), 0.001f * static_cast<float>(me + step + 1));
      const size_t issued_before = log->calls.size();
      for (int i = params.size() - 1; i >= 0; --i) {
        if (me == step % n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        dp->grad_ready(i);
      }
      if (in_order && !c.accumulate_fp32) {
        // Every bucket is ready, and none waits for the previous one to complete (whose
        // completion needs the slow rank), nor an FP8 one for the host to see its amax come
        // back: every reduction (after its amax) has started before finish().
        EXPECT_EQ(log->calls.size() - issued_before, buckets * (core::is_fp8(c.dtype) ? 2 : 1))
            << describe(c);
      }
      EXPECT_FALSE(finish_saw_nonfinite(*dp, *backend, params.grads())) << describe(c);
      if (c.zero_stage == 0) {
        // Every bucket averaged: 0.001 (step + 1 + r) over the ranks r, within the rounding of
        // the reduce dtype (each value once, then each of the n - 1 additions).
        const double mean = 0.001 * (step + 1 + 0.5 * (n - 1));
        const double bound = (2.0 * n - 1.0) * testing::unit_roundoff(c.dtype) * mean;
        const float* g = params.grads().data_as<float>();
        for (int64_t i = 0; i < params.flat_numel(); i += 97) {
          EXPECT_NEAR(g[i], mean, bound) << describe(c) << " element " << i;
        }
      }
    }
    // The recorder must have seen every collective of every bucket: an amax (FP8), the
    // reduction, and the all-gather (accumulate_fp32 under ZeRO-0).
    const size_t per_bucket =
        (core::is_fp8(c.dtype) ? 1 : 0) + 1 + (c.accumulate_fp32 && c.zero_stage == 0 ? 1 : 0);
    EXPECT_EQ(log->calls.size(), static_cast<size_t>(steps) * buckets * per_bucket) << describe(c);
    return log->calls;
  }

  // Every rank compares its calls with rank 0's and reports the first difference.
  void expect_same_on_every_rank(const std::vector<Call>& calls, const std::string& what) {
    auto comm = make_mpi_communicator(testing::world(), kTimeout);
    std::vector<int64_t> words;
    for (const Call& c : calls) {
      words.insert(words.end(),
                   {static_cast<int64_t>(c.kind), c.comm, static_cast<int64_t>(c.dtype), c.numel});
    }
    int64_t count = static_cast<int64_t>(calls.size());
    Tensor count_buf = Tensor::wrap(&count, Shape{1}, DType::kI64);
    comm->broadcast(count_buf, 0)->wait();
    std::vector<int64_t> reference(static_cast<size_t>(count) * kWordsPerCall);
    if (me == 0) reference = words;
    if (count > 0) {
      Tensor buf = Tensor::wrap(reference.data(), Shape{static_cast<int64_t>(reference.size())},
                                DType::kI64);
      comm->broadcast(buf, 0)->wait();
    }

    const size_t common = std::min(calls.size(), static_cast<size_t>(count));
    for (size_t i = 0; i < common; ++i) {
      const int64_t* r = &reference[i * kWordsPerCall];
      const Call expected{static_cast<Kind>(r[0]), r[1], static_cast<DType>(r[2]), r[3]};
      if (std::equal(r, r + kWordsPerCall, &words[i * kWordsPerCall])) continue;
      ADD_FAILURE() << what << ": collective " << i << " of rank " << me << " is "
                    << describe(calls[i]) << ", rank 0's is " << describe(expected);
      return;
    }
    EXPECT_EQ(calls.size(), static_cast<size_t>(count))
        << what << ": rank " << me << " issued another number of collectives than rank 0";
  }

  std::unique_ptr<core::Backend> backend;
  int n = 1, me = 0;
};

TEST_F(IssueOrder, EveryRankIssuesThePipelineInTheSameOrderWhateverItsTiming) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kE4M3}) {
    for (bool accumulate : {false, true}) {
      for (int zero : {0, 1}) {
        for (bool in_order : {false, true}) {
          const SyncCase c{d, accumulate, zero};
          expect_same_on_every_rank(run_steps(c, 3, in_order),
                                    describe(c) + (in_order ? " in order" : ""));
        }
      }
    }
  }
}

// Where a host communicator is given beside the control one (MPI beside NCCL), the step's
// scalar collectives go through it, so that none waits for a device; the gradient pipeline
// and the start-up broadcast stay on the control communicator's duplicates.
TEST_F(IssueOrder, ScalarCollectivesGoThroughTheHostCommunicatorWhereOneIsGiven) {
  auto pipeline = std::make_shared<Log>();
  auto scalars = std::make_shared<Log>();
  train::ParameterStore params = make_sync_store(*backend);
  DistConfig config;
  config.timeout_s = kTimeout;
  auto dp = DataParallel::create(*backend, params, config,
                                 std::make_unique<RecordingCommunicator>(
                                     make_mpi_communicator(testing::world(), kTimeout), pipeline),
                                 std::make_unique<RecordingCommunicator>(
                                     make_mpi_communicator(testing::world(), kTimeout), scalars));
  dp->broadcast_parameters();
  const size_t before = pipeline->calls.size();
  std::vector<float> flags{static_cast<float>(me), 0.5f};
  dp->max_across_ranks(flags);
  EXPECT_EQ(flags, (std::vector<float>{static_cast<float>(n - 1), 0.5f}));
  EXPECT_EQ(dp->sum_across_ranks(1.0), static_cast<double>(n));
  EXPECT_EQ(pipeline->calls.size(), before) << "a scalar collective went to the control one";
  ASSERT_EQ(scalars->calls.size(), 2u);
  EXPECT_EQ(scalars->calls[0].kind, Kind::kAllReduce);
  EXPECT_EQ(scalars->calls[1].kind, Kind::kAllGather);
}

}  // namespace
}  // namespace mantissa::dist
