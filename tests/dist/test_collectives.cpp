// Every collective of the MPI communicator and every dtype, against FP64 references computed
// on each rank from the inputs of all ranks (each rank can regenerate any rank's data).
//
// Sums in a reduced dtype round once per hop: with N ranks a result may carry N - 1
// roundings, so it must lie within gamma(N - 1) * sum |x_r| of the exact sum
// (gamma(k) = k u / (1 - k u), u the unit roundoff), plus half the smallest subnormal per
// rounding. Every rank must also get the same bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/ops/cpu/cpu_convert.h"
#include "dist/communicator.h"
#include "dist/mpi/mpi_communicator.h"
#include "dist/poll_wait.h"
#include "dist/world.h"
#include "tests/dist/dist_test.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

constexpr double kTimeout = 60.0;
const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2};

// Values [first, first + n) of rank r in test `salt`, already representable in dtype d: a
// random sign and mantissa times 2^k with k in [-6, 2], so sums of 4 ranks stay far below
// FP8's maximum.
std::vector<float> values(DType d, int rank, int64_t first, int64_t n, uint64_t salt) {
  std::vector<float> raw(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = core::random_u32(salt * 1000003 + static_cast<uint64_t>(rank),
                                           static_cast<uint64_t>(first + i));
    const float mantissa = static_cast<float>(bits & 0xFFFF) / 65536.0f;
    const int exponent = static_cast<int>((bits >> 16) % 9) - 6;
    raw[static_cast<size_t>(i)] = std::ldexp(mantissa, exponent) * ((bits >> 31) ? -1.0f : 1.0f);
  }
  std::vector<uint8_t> codes(static_cast<size_t>(n) * 4);
  core::narrow_from_f32(raw.data(), codes.data(), d, n, core::NarrowOptions{});
  core::widen_to_f32(codes.data(), d, raw.data(), n);
  return raw;
}

float value(DType d, int rank, int64_t i, uint64_t salt) {
  return values(d, rank, i, 1, salt)[0];
}

Tensor make(DType d, int rank, int64_t n, uint64_t salt) {
  const std::vector<float> v = values(d, rank, 0, n, salt);
  Tensor t = Tensor::empty(Shape{n}, d);
  core::narrow_from_f32(v.data(), t.data(), d, n, core::NarrowOptions{});
  return t;
}

std::vector<float> decode(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  core::widen_to_f32(t.data(), t.dtype(), out.data(), t.numel());
  return out;
}

// True when every rank holds the same bytes in `t`.
bool same_on_all_ranks(const Tensor& t) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// Each test runs twice: with the default pieces (every buffer here in one MPI call) and with
// pieces of 4 KiB, so every collective is cut into several calls (1024 F32 or 4096 FP8
// elements each).
class Collectives : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { comm = make_mpi_communicator(testing::world(), kTimeout, GetParam()); }
  int n() const { return comm->size(); }
  int me() const { return comm->rank(); }

  // Checks result[i] (i in [0, count)) against the FP64 sum over ranks of element
  // first + i of each rank's data.
  void expect_sum(DType d, const Tensor& result, int64_t first, uint64_t salt) {
    const std::vector<float> got = decode(result);
    const double u = testing::unit_roundoff(d);
    const double k = n() - 1;
    const double gamma = k * u / (1.0 - k * u);
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n(); ++r) inputs.push_back(values(d, r, first, result.numel(), salt));
    int bad = 0;
    for (int64_t i = 0; i < result.numel(); ++i) {
      double exact = 0.0, magnitude = 0.0;
      for (int r = 0; r < n(); ++r) {
        const double x = inputs[static_cast<size_t>(r)][static_cast<size_t>(i)];
        exact += x;
        magnitude += std::fabs(x);
      }
      const double bound = gamma * magnitude + k * testing::half_min_subnormal(d);
      if (!(std::fabs(got[static_cast<size_t>(i)] - exact) <= bound) && ++bad <= 3) {
        ADD_FAILURE() << core::dtype_name(d) << " element " << first + i << ": got "
                      << got[static_cast<size_t>(i)] << ", FP64 sum " << exact << ", bound "
                      << bound;
      }
    }
    EXPECT_EQ(bad, 0) << core::dtype_name(d) << ": elements out of bounds";
  }

  std::unique_ptr<Communicator> comm;
};

TEST_P(Collectives, AllReduceSumEveryDtype) {
  for (DType d : kFloatTypes) {
    for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{300007}}) {
      Tensor buf = make(d, me(), count, 1);
      comm->all_reduce(buf, ReduceOp::kSum)->wait();
      expect_sum(d, buf, 0, 1);
      EXPECT_TRUE(same_on_all_ranks(buf)) << core::dtype_name(d) << " count " << count;
    }
  }
}

TEST_P(Collectives, AllReduceMaxEveryDtype) {
  for (DType d : kFloatTypes) {
    const int64_t count = 4099;
    Tensor buf = make(d, me(), count, 2);
    comm->all_reduce(buf, ReduceOp::kMax)->wait();
    const std::vector<float> got = decode(buf);
    std::vector<float> expected_all = values(d, 0, 0, count, 2);
    for (int r = 1; r < n(); ++r) {
      const std::vector<float> other = values(d, r, 0, count, 2);
      for (int64_t i = 0; i < count; ++i) {
        float& e = expected_all[static_cast<size_t>(i)];
        e = std::max(e, other[static_cast<size_t>(i)]);
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      const float expected = expected_all[static_cast<size_t>(i)];
      ASSERT_EQ(got[static_cast<size_t>(i)], expected) << core::dtype_name(d) << " element " << i;
    }
  }
  std::vector<int64_t> ints{me(), -me(), int64_t{1} << 40};
  Tensor t = Tensor::wrap(ints.data(), Shape{3}, DType::kI64);
  comm->all_reduce(t, ReduceOp::kMax)->wait();
  EXPECT_EQ(ints, (std::vector<int64_t>{n() - 1, 0, int64_t{1} << 40}));
}

// Uneven chunks, one of them empty: counts[r] = 5001 (r + 1), except the last rank's, 0. With
// 2 ranks too the whole buffer exceeds a 4 KiB piece of every dtype.
std::vector<int64_t> uneven_counts(int n) {
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(r == n - 1 ? 0 : 5001 * (r + 1));
  return counts;
}

TEST_P(Collectives, ReduceScatterUnevenEveryDtype) {
  const std::vector<int64_t> counts = uneven_counts(n());
  const std::vector<int64_t> offsets = chunk_offsets(counts);
  for (DType d : kFloatTypes) {
    Tensor send = make(d, me(), offsets.back(), 3);
    Tensor recv = Tensor::empty(Shape{counts[static_cast<size_t>(me())]}, d);
    comm->reduce_scatter(send, recv, counts, ReduceOp::kSum)->wait();
    expect_sum(d, recv, offsets[static_cast<size_t>(me())], 3);
  }
}

TEST_P(Collectives, AllGatherUnevenInAndOutOfPlace) {
  const std::vector<int64_t> counts = uneven_counts(n());
  const std::vector<int64_t> offsets = chunk_offsets(counts);
  for (DType d : kFloatTypes) {
    for (bool in_place : {false, true}) {
      Tensor recv = Tensor::empty(Shape{offsets.back()}, d);
      const int64_t mine = counts[static_cast<size_t>(me())];
      Tensor send = in_place ? recv.view(offsets[static_cast<size_t>(me())], Shape{mine})
                             : Tensor::empty(Shape{mine}, d);
      const Tensor data = make(d, me(), mine, 4);
      std::memcpy(send.data(), data.data(), data.nbytes());
      comm->all_gather(send, recv, counts)->wait();
      const std::vector<float> got = decode(recv);
      for (int r = 0; r < n(); ++r) {
        for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(offsets[static_cast<size_t>(r)] + i)],
                    value(d, r, i, 4))
              << core::dtype_name(d) << (in_place ? " in place" : "") << ": rank " << r
              << " element " << i;
        }
      }
    }
  }
}

TEST_P(Collectives, BroadcastFromTheLastRank) {
  const int root = n() - 1;
  for (DType d : kFloatTypes) {
    Tensor buf = make(d, me(), 5000, 5);
    comm->broadcast(buf, root)->wait();
    EXPECT_EQ(decode(buf), values(d, root, 0, 5000, 5)) << core::dtype_name(d);
  }
}

TEST_P(Collectives, AllToAllUneven) {
  // Rank s sends 1001 (s + 1) (r + 2) elements to rank r: element i of that chunk is rank s's
  // value number 100000 r + i.
  for (DType d : kFloatTypes) {
    std::vector<int64_t> send_counts, recv_counts;
    for (int r = 0; r < n(); ++r) {
      send_counts.push_back(1001 * (me() + 1) * (r + 2));
      recv_counts.push_back(1001 * (r + 1) * (me() + 2));
    }
    const std::vector<int64_t> send_offsets = chunk_offsets(send_counts);
    std::vector<float> values;
    for (int r = 0; r < n(); ++r) {
      for (int64_t i = 0; i < send_counts[static_cast<size_t>(r)]; ++i) {
        values.push_back(value(d, me(), 100000 * r + i, 6));
      }
    }
    Tensor send = Tensor::empty(Shape{send_offsets.back()}, d);
    core::narrow_from_f32(values.data(), send.data(), d, send.numel(), core::NarrowOptions{});
    Tensor recv = Tensor::empty(Shape{chunk_offsets(recv_counts).back()}, d);
    comm->all_to_all(send, send_counts, recv, recv_counts)->wait();
    const std::vector<float> got = decode(recv);
    size_t k = 0;
    for (int s = 0; s < n(); ++s) {
      for (int64_t i = 0; i < recv_counts[static_cast<size_t>(s)]; ++i, ++k) {
        ASSERT_EQ(got[k], value(d, s, 100000 * me() + i, 6))
            << core::dtype_name(d) << ": from rank " << s << " element " << i;
      }
    }
  }
}

TEST_P(Collectives, DuplicatesOverlapAndCompleteInAnyOrder) {
  // Three collectives in flight at once on three communicators, waited for in reverse.
  auto second = comm->duplicate();
  auto third = comm->duplicate();
  Tensor a = make(DType::kBF16, me(), 100000, 7);
  Tensor b = make(DType::kF32, me(), 100000, 8);
  Tensor c = make(DType::kE5M2, me(), 100000, 9);
  RequestPtr ra = comm->all_reduce(a, ReduceOp::kSum);
  RequestPtr rb = second->all_reduce(b, ReduceOp::kSum);
  RequestPtr rc = third->all_reduce(c, ReduceOp::kSum);
  rc->wait();
  rb->wait();
  while (!ra->test()) {
  }
  expect_sum(DType::kBF16, a, 0, 7);
  expect_sum(DType::kF32, b, 0, 8);
  expect_sum(DType::kE5M2, c, 0, 9);
  comm->barrier();
}

TEST_P(Collectives, MismatchedArgumentsAreRejectedWithTheirShapes) {
  Tensor send = Tensor::empty(Shape{10}, DType::kF32);
  Tensor recv = Tensor::empty(Shape{3}, DType::kF32);
  try {
    comm->reduce_scatter(send, recv, std::vector<int64_t>(static_cast<size_t>(n()), 3),
                         ReduceOp::kSum);
    ADD_FAILURE() << "expected core::Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("counts add up to"), std::string::npos) << e.what();
  }
  // Counts that add up but hold a negative one (which NCCL would take as a huge size_t), and
  // an all_to_all whose rank sends itself other than it receives: refused before any message.
  std::vector<int64_t> counts(static_cast<size_t>(n()), 0);
  counts[0] = 13;
  counts[1] = -3;
  try {
    comm->reduce_scatter(send, recv, counts, ReduceOp::kSum);
    ADD_FAILURE() << "expected core::Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MPI reduce_scatter: negative count -3"),
              std::string::npos)
        << e.what();
  }
  std::vector<int64_t> send_counts(static_cast<size_t>(n()), 2), recv_counts = send_counts;
  send_counts[static_cast<size_t>(me())] = 1;
  send_counts[static_cast<size_t>((me() + 1) % n())] = 3;
  Tensor a2a_send = Tensor::empty(Shape{2 * n()}, DType::kF32);
  Tensor a2a_recv = Tensor::empty(Shape{2 * n()}, DType::kF32);
  try {
    comm->all_to_all(a2a_send, send_counts, a2a_recv, recv_counts);
    ADD_FAILURE() << "expected core::Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "MPI all_to_all: this rank sends itself 1 elements but receives 2"),
              std::string::npos)
        << e.what();
  }
}

// A receive shorter than what its peer sends (counts that disagree across ranks) fails on the
// receiving rank with MPI's own reason and the operation, not MPI_Testall's summary
// ("error code in status"); the other ranks complete.
TEST_P(Collectives, AllToAllCountsThatDisagreeNameTheTruncation) {
  std::vector<int64_t> send_counts(static_cast<size_t>(n()), 10), recv_counts = send_counts;
  if (me() == 1) recv_counts[0] = 5;
  Tensor send = make(DType::kF32, me(), 10 * n(), 10);
  Tensor recv = Tensor::empty(Shape{chunk_offsets(recv_counts).back()}, DType::kF32);
  std::string error = "none";
  try {
    comm->all_to_all(send, send_counts, recv, recv_counts)->wait();
  } catch (const core::Error& e) {
    error = e.what();
  }
  if (me() == 1) {
    const std::string expected = "MPI all_to_all of f32[" + std::to_string(10 * n()) +
                                 "] on cpu failed on rank 1: MPI_ERR_TRUNCATE";
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  } else {
    EXPECT_EQ(error, "none");
  }
  comm->barrier();
}

// The progress thread (MPI_THREAD_MULTIPLE) completes a collective while no rank calls MPI:
// 4 MiB take several rendezvous and ring rounds, each of which needs both ranks to enter MPI,
// so without the thread the first test() after the pause could not find it complete.
TEST_P(Collectives, ProgressThreadCompletesACollectiveWhileTheRanksCompute) {
  int provided = 0;
  MPI_Query_thread(&provided);
  ASSERT_EQ(provided, MPI_THREAD_MULTIPLE) << "World asks MPI for MPI_THREAD_MULTIPLE";
  Tensor buf = make(DType::kF32, me(), 1 << 20, 21);
  RequestPtr r = comm->all_reduce(buf, ReduceOp::kSum);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // "computing": no MPI call
  EXPECT_TRUE(r->test()) << "4 MiB all-reduce not complete after 3 s without MPI calls";
  r->wait();
  expect_sum(DType::kF32, buf, 0, 21);
}

INSTANTIATE_TEST_SUITE_P(MaxPieceBytes, Collectives, ::testing::Values(kMpiMaxPieceBytes, 4096),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param == kMpiMaxPieceBytes ? std::string("OneCall")
                                                                  : std::string("Pieces");
                         });

// Buffers past 2^31 elements and bytes, as the buckets or masters of a model past 2B
// parameters are: an E4M3 sum over three default pieces, whose values change at the pieces'
// edges, then a U8 all-gather of two chunks of two pieces each, every byte a hash of its
// position; a piece landing at a wrong offset shows in either. Its own ctest entry runs it
// with 2 ranks (3.2 GB peak each, measured); the others leave it out.
TEST(LargeCount, AllReduceAndAllGatherPast2To31Elements) {
  // Each collective moves gigabytes: seconds alone, more beside other tests.
  auto comm = make_mpi_communicator(testing::world(), 5 * kTimeout);
  const int64_t count = (int64_t{1} << 31) + 7;
  const int64_t piece = kMpiMaxPieceBytes;
  const std::vector<int64_t> marked = {0, piece - 1, piece, 2 * piece - 1, 2 * piece, count - 1};
  const int n = comm->size();

  Tensor buf = Tensor::empty(Shape{count}, DType::kE4M3);
  auto* codes = static_cast<uint8_t*>(buf.data());
  std::memset(codes, core::e4m3_from_float(1.0f).bits, static_cast<size_t>(count));
  for (int64_t i : marked) codes[i] = core::e4m3_from_float(0.25f * (comm->rank() + 1)).bits;
  comm->all_reduce(buf, ReduceOp::kSum)->wait();
  const uint8_t bulk = core::e4m3_from_float(static_cast<float>(n)).bits;
  const uint8_t edge = core::e4m3_from_float(0.125f * n * (n + 1)).bits;
  for (int64_t i : marked) {
    EXPECT_EQ(codes[i], edge) << "element " << i;
    codes[i] = bulk;
  }
  EXPECT_EQ(std::count(codes, codes + count, bulk), count) << "elements other than the sum " << n;

  // Rank r's chunk holds pattern(i) at its global positions i; the other chunks start zeroed.
  const auto pattern = [](int64_t i) {
    return static_cast<uint8_t>((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL) >> 56);
  };
  std::vector<int64_t> counts(static_cast<size_t>(n), count / n);
  counts.back() += count % n;
  const std::vector<int64_t> offsets = chunk_offsets(counts);
  const int64_t begin = offsets[static_cast<size_t>(comm->rank())];
  const int64_t end = offsets[static_cast<size_t>(comm->rank()) + 1];
  for (int64_t i = 0; i < count; ++i) codes[i] = i >= begin && i < end ? pattern(i) : 0;
  Tensor bytes = Tensor::wrap(codes, Shape{count}, DType::kU8);
  comm->all_gather(bytes.view(begin, Shape{end - begin}), bytes, counts)->wait();
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) wrong += codes[i] != pattern(i);
  EXPECT_EQ(wrong, 0) << "bytes differ from their owner's after the all-gather";
}

// A rank waiting for a late one sleeps between polls instead of holding its core: spinning
// through the wait starved another job's rank bound to the same core (minutes per step). The
// last rank joins a barrier 1 s late; the others' CPU time over their wait, every thread's
// (the waiting one, and the MPI progress thread that drives the collective meanwhile), stays
// far below its length (a spinning wait uses about all of it, a sleeping one a few percent).
TEST(Wait, ForALateRankSleepsInsteadOfSpinning) {
  auto comm = make_mpi_communicator(testing::world(), kTimeout);
  comm->barrier();
  const bool late = comm->rank() == comm->size() - 1;
  if (late) std::this_thread::sleep_for(std::chrono::seconds(1));
  timespec cpu_before{}, cpu_after{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_before);
  const auto wall_before = std::chrono::steady_clock::now();
  comm->barrier();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_after);
  if (late) return;
  const double cpu_s = static_cast<double>(cpu_after.tv_sec - cpu_before.tv_sec) +
                       1e-9 * static_cast<double>(cpu_after.tv_nsec - cpu_before.tv_nsec);
  ASSERT_GT(wall_s, 0.5) << "the barrier did not wait for the late rank";
  EXPECT_LT(cpu_s, 0.25 * wall_s) << "rank " << comm->rank() << " used " << cpu_s
                                  << " s of CPU in a wait of " << wall_s << " s";
}

// A wait that gives up (draining an aborted NCCL communicator's stream) does so at its
// deadline, sleeping through it as a long wait does.
TEST(Wait, GivesUpAtItsDeadlineWithoutSpinning) {
  timespec cpu_before{}, cpu_after{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_before);
  const auto wall_before = std::chrono::steady_clock::now();
  int polls = 0;
  EXPECT_FALSE(poll_for([&] { return ++polls < 0; }, 0.5));
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_after);
  const double cpu_s = static_cast<double>(cpu_after.tv_sec - cpu_before.tv_sec) +
                       1e-9 * static_cast<double>(cpu_after.tv_nsec - cpu_before.tv_nsec);
  EXPECT_GE(wall_s, 0.5);
  EXPECT_LT(cpu_s, 0.25 * wall_s) << cpu_s << " s of CPU in a wait of " << wall_s << " s";
  EXPECT_GT(polls, 1);

  polls = 0;
  EXPECT_TRUE(poll_for([&] { return ++polls == 3; }, 10.0));
  EXPECT_EQ(polls, 3);
  EXPECT_FALSE(poll_for([] { return false; }, -1.0)) << "a deadline already past";
}

// Every rank knows every rank's host (here all on this one machine); a timeout names the
// distinct hosts of the silent ranks in rank order.
TEST(World, KnowsTheHostOfEveryRank) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  ASSERT_EQ(MPI_Get_processor_name(name, &length), MPI_SUCCESS);
  for (int r = 0; r < testing::world().size(); ++r) {
    EXPECT_EQ(testing::world().host_of(r), std::string(name, static_cast<size_t>(length))) << r;
  }
  const std::vector<std::string> hosts = {"node1", "node1", "node2", "node2", "node3"};
  EXPECT_EQ(format_hosts({2, 3}, hosts), "node2");
  EXPECT_EQ(format_hosts({4, 1, 3}, hosts), "node3, node1, node2");
  EXPECT_EQ(format_hosts({}, hosts), "");
}

}  // namespace
}  // namespace mantissa::dist
