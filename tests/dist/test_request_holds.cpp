// A Request holds every tensor given to its collective until the collective completes
// (dist/communicator.h): a caller may drop its handles at once, and the memory is released
// only after test() has returned true, wait() has returned, or the request is gone. On a GPU
// this is what keeps the caching allocator from handing a buffer to a kernel on the backend's
// stream while the communicator's stream still uses it; the bookkeeping is the base class's,
// so the MPI communicator shows it on the CPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "dist/mpi/mpi_communicator.h"
#include "tests/dist/dist_test.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

constexpr double kTimeout = 60.0;
constexpr int64_t kChunk = 1000;

// Rank r's input element i: exact in F32, and so are sums over a few ranks.
float input(int rank, int64_t i) {
  return static_cast<float>(rank * 10000 + i);
}

Tensor inputs(int rank, int64_t n) {
  Tensor t = Tensor::empty(Shape{n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = input(rank, i);
  return t;
}

class RequestHolds : public ::testing::Test {
 protected:
  void SetUp() override { comm = make_mpi_communicator(testing::world(), kTimeout); }
  int n() const { return comm->size(); }
  int me() const { return comm->rank(); }

  std::unique_ptr<Communicator> comm;
};

TEST_F(RequestHolds, DroppedSendBufferLivesUntilWaitReturns) {
  Tensor send = inputs(me(), kChunk * n());
  Tensor recv = Tensor::empty(Shape{kChunk}, DType::kF32);
  const std::weak_ptr<const core::Storage> watch = send.storage_watch();
  RequestPtr request =
      comm->reduce_scatter(send, recv, std::vector<int64_t>(n(), kChunk), ReduceOp::kSum);
  send = Tensor();  // the caller's only handle
  EXPECT_FALSE(watch.expired()) << "the request must hold the send buffer until it completes";
  request->wait();
  EXPECT_TRUE(watch.expired()) << "a completed request must release the send buffer";
  // recv is still the caller's (one owner again) and holds the right sums.
  EXPECT_EQ(recv.storage_watch().use_count(), 1);
  for (int64_t i = 0; i < kChunk; ++i) {
    float expected = 0.0f;
    for (int r = 0; r < n(); ++r) expected += input(r, me() * kChunk + i);
    ASSERT_EQ(recv.data_as<float>()[i], expected) << "element " << i;
  }
}

TEST_F(RequestHolds, DroppedBuffersLiveUntilTestReturnsTrue) {
  Tensor send = inputs(me(), kChunk);
  Tensor recv = Tensor::empty(Shape{kChunk * n()}, DType::kF32);
  const std::weak_ptr<const core::Storage> send_watch = send.storage_watch();
  RequestPtr request = comm->all_gather(send, recv, std::vector<int64_t>(n(), kChunk));
  send = Tensor();
  while (!request->test()) EXPECT_FALSE(send_watch.expired());
  EXPECT_TRUE(send_watch.expired()) << "test() returned true: the send buffer is released";
  EXPECT_TRUE(request->test()) << "a completed request stays complete";
  for (int r = 0; r < n(); ++r) {
    for (int64_t i = 0; i < kChunk; ++i) {
      ASSERT_EQ(recv.data_as<float>()[r * kChunk + i], input(r, i)) << "rank " << r << " " << i;
    }
  }
}

TEST_F(RequestHolds, InPlaceBufferLivesUntilTheRequestIsDestroyed) {
  Tensor buf = inputs(me(), kChunk);
  const std::weak_ptr<const core::Storage> watch = buf.storage_watch();
  RequestPtr request = comm->all_reduce(buf, ReduceOp::kSum);
  buf = Tensor();
  EXPECT_FALSE(watch.expired());
  request.reset();  // the destructor waits for the collective, then lets go
  EXPECT_TRUE(watch.expired());
}

TEST_F(RequestHolds, CallerHandlesAreUntouchedAfterCompletion) {
  Tensor buf = inputs(me(), kChunk);
  RequestPtr request = comm->broadcast(buf, n() - 1);
  EXPECT_EQ(buf.storage_watch().use_count(), 2) << "the caller's handle and the request's";
  request->wait();
  EXPECT_EQ(buf.storage_watch().use_count(), 1);
  for (int64_t i = 0; i < kChunk; ++i) ASSERT_EQ(buf.data_as<float>()[i], input(n() - 1, i));
}

}  // namespace
}  // namespace mantissa::dist
