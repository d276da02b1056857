#include "dist/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <sstream>

#include "core/dtype/dtype.h"
#include "dist/mpi/mpi_check.h"
#include "dist/mpi/mpi_comm_handle.h"
#include "dist/mpi/mpi_progress.h"
#include "dist/poll_wait.h"

namespace mantissa::dist {

using core::DType;
using core::Tensor;

namespace {

// ---------------------------------------------------------------------------------------
// Reductions of reduced-precision codes: widen both operands to FP32, combine, round once.
// The dtype is known from the operation (one MPI_Op per dtype and operation); MPI only sees
// 8- or 16-bit integers.
struct Bf16Codec {
  using Code = uint16_t;
  static float widen(Code c) { return core::bf16_to_float(core::bf16{c}); }
  static Code narrow(float x) { return core::bf16_from_float(x).bits; }
};
struct F16Codec {
  using Code = uint16_t;
  static float widen(Code c) { return core::fp16_to_float(core::fp16{c}); }
  static Code narrow(float x) { return core::fp16_from_float(x).bits; }
};
// FP8 sums saturate (SATFINITE), like NCCL's and cuda_fp8.h's conversions: DataParallel
// scales buckets so that a sum cannot reach the maximum.
struct E4M3Codec {
  using Code = uint8_t;
  static float widen(Code c) { return core::e4m3_to_float(core::fp8_e4m3{c}); }
  static Code narrow(float x) { return core::e4m3_from_float(x).bits; }
};
struct E5M2Codec {
  using Code = uint8_t;
  static float widen(Code c) { return core::e5m2_to_float(core::fp8_e5m2{c}); }
  static Code narrow(float x) { return core::e5m2_from_float(x).bits; }
};

template <class Codec>
void sum_codes(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const typename Codec::Code*>(in);
  auto* b = static_cast<typename Codec::Code*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Codec::narrow(Codec::widen(a[i]) + Codec::widen(b[i]));
}

// FP8 has only 256 x 256 pairs of operands: a table of their rounded sums (64 KiB, built once
// from the same conversions) replaces two decodes, an add and a branchy encode per element.
template <class Codec>
const std::array<uint8_t, 65536>& fp8_sum_table() {
  static const std::array<uint8_t, 65536> table = [] {
    std::array<uint8_t, 65536> t{};
    for (uint32_t a = 0; a < 256; ++a) {
      for (uint32_t b = 0; b < 256; ++b) {
        t[a << 8 | b] = Codec::narrow(Codec::widen(static_cast<uint8_t>(a)) +
                                      Codec::widen(static_cast<uint8_t>(b)));
      }
    }
    return t;
  }();
  return table;
}

template <class Codec>
void sum_fp8_codes(void* in, void* inout, int* len, MPI_Datatype*) {
  const std::array<uint8_t, 65536>& table = fp8_sum_table<Codec>();
  const auto* a = static_cast<const uint8_t*>(in);
  auto* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = table[static_cast<uint32_t>(a[i]) << 8 | b[i]];
}

// NaN wins, so a MAX over flags or amaxes never hides one.
template <class Codec>
void max_codes(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const typename Codec::Code*>(in);
  auto* b = static_cast<typename Codec::Code*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Codec::widen(a[i]), y = Codec::widen(b[i]);
    if (x != x || x > y) b[i] = a[i];
  }
}

// One user-defined operation, freed with its owner.
class MpiOp {
 public:
  MpiOp(MPI_User_function* function) {
    MANTISSA_MPI_CHECK(MPI_Op_create(function, /*commute=*/1, &op_));
  }
  ~MpiOp() {
    if (op_ != MPI_OP_NULL) MPI_Op_free(&op_);
  }
  MpiOp(const MpiOp&) = delete;
  MpiOp& operator=(const MpiOp&) = delete;
  MPI_Op get() const { return op_; }

 private:
  MPI_Op op_ = MPI_OP_NULL;
};

struct ReducedOps {
  MpiOp bf16_sum{&sum_codes<Bf16Codec>}, bf16_max{&max_codes<Bf16Codec>};
  MpiOp f16_sum{&sum_codes<F16Codec>}, f16_max{&max_codes<F16Codec>};
  MpiOp e4m3_sum{&sum_fp8_codes<E4M3Codec>}, e4m3_max{&max_codes<E4M3Codec>};
  MpiOp e5m2_sum{&sum_fp8_codes<E5M2Codec>}, e5m2_max{&max_codes<E5M2Codec>};
};

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kU8: return MPI_UINT8_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
  }
  MANTISSA_FAIL("MPI communicator: unsupported dtype " << core::dtype_name(dtype));
}

MPI_Op mpi_op(const ReducedOps& ops, DType dtype, ReduceOp op) {
  const bool sum = op == ReduceOp::kSum;
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
    case DType::kI64: return sum ? MPI_SUM : MPI_MAX;
    case DType::kBF16: return (sum ? ops.bf16_sum : ops.bf16_max).get();
    case DType::kF16: return (sum ? ops.f16_sum : ops.f16_max).get();
    case DType::kE4M3: return (sum ? ops.e4m3_sum : ops.e4m3_max).get();
    case DType::kE5M2: return (sum ? ops.e5m2_sum : ops.e5m2_max).get();
    case DType::kU8: break;
  }
  MANTISSA_FAIL("MPI communicator: no reduction for dtype " << core::dtype_name(dtype));
}

// Element `i` of a host tensor.
char* element(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data()) + i * static_cast<int64_t>(core::dtype_size(t.dtype()));
}

// Calls issue(first, count) for consecutive pieces [first, first + count) of [0, total), each
// of at most `piece` elements (which fits an int).
template <class Issue>
void for_each_piece(int64_t total, int64_t piece, Issue issue) {
  for (int64_t first = 0; first < total; first += piece) {
    issue(first, static_cast<int>(std::min(piece, total - first)));
  }
}

std::vector<int> int_vector(const std::vector<int64_t>& values) {
  return std::vector<int>(values.begin(), values.end());
}

void check_host(const Tensor& t, const char* op, const char* operand) {
  MANTISSA_CHECK(t.device().is_cpu(), "MPI communicator " << op << ": " << operand
                                                          << " must be host memory, got "
                                                          << t.describe());
}

// A non-blocking collective: one MPI request, or several when it was issued in pieces. MPI
// forbids freeing a pending collective request, so the destructor of one still in flight (an
// exception unwinding a step) waits for it, bounded like every wait, and ends the job rather
// than throw from a destructor.
class MpiRequest final : public Request {
 public:
  MpiRequest(const World& world, double timeout_s, std::string what,
             std::shared_ptr<MpiProgress> progress)
      : world_(world),
        timeout_s_(timeout_s),
        what_(std::move(what)),
        progress_(std::move(progress)) {}
  ~MpiRequest() override {
    if (requests_.empty()) return;
    try {
      wait();
    } catch (const std::exception& e) {
      world_.abort(1, e.what());
    }
  }

  // A new slot for the handle of one MPI call of this operation.
  MPI_Request* add() { return &requests_.emplace_back(MPI_REQUEST_NULL); }
  // Every call of the operation has been started: the progress thread drives them from now on.
  void issued() {
    if (progress_ && !requests_.empty()) {
      progress_->begin();
      counted_ = true;
    }
  }

 protected:
  bool poll() override {
    if (requests_.empty()) return true;
    int done = 0;
    statuses_.resize(requests_.size());
    const int result =
        MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, statuses_.data());
    if (result == MPI_ERR_IN_STATUS) {
      // Name the error of the call that failed (a truncated message, ...), not the summary.
      for (const MPI_Status& status : statuses_) {
        if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
          MANTISSA_FAIL(mpi_error_message(what_.c_str(), status.MPI_ERROR));
        }
      }
    }
    MANTISSA_CHECK(result == MPI_SUCCESS, mpi_error_message(what_.c_str(), result));
    if (!done) return false;
    requests_.clear();
    if (counted_) {
      progress_->end();
      counted_ = false;
    }
    return true;
  }

  void wait_until_done() override {
    poll_until([this] { return poll(); }, timeout_s_,
               [this](double waited_s) { world_.abort_on_timeout(what_, waited_s); });
  }

 private:
  const World& world_;
  double timeout_s_;
  std::string what_;
  std::shared_ptr<MpiProgress> progress_;  // null: no progress thread
  bool counted_ = false;                   // in progress_'s count of collectives in flight
  std::vector<MPI_Request> requests_;      // empty once complete
  std::vector<MPI_Status> statuses_;       // of the last MPI_Testall
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const World& world, double timeout_s, int64_t max_piece_bytes, MPI_Comm parent,
                  std::shared_ptr<const ReducedOps> ops, std::shared_ptr<MpiProgress> progress)
      : world_(world),
        timeout_s_(timeout_s),
        max_piece_bytes_(max_piece_bytes),
        comm_(parent),
        ops_(std::move(ops)),
        progress_(std::move(progress)) {
    MANTISSA_MPI_CHECK(MPI_Comm_rank(comm_.get(), &rank_));
    MANTISSA_MPI_CHECK(MPI_Comm_size(comm_.get(), &size_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  core::Device device() const override { return core::Device::cpu(); }
  bool runs_in_order() const override { return false; }

  std::unique_ptr<Communicator> duplicate() override {
    return std::make_unique<MpiCommunicator>(world_, timeout_s_, max_piece_bytes_, comm_.get(),
                                             ops_, progress_);
  }

  RequestPtr all_reduce(Tensor& buf, ReduceOp op) override {
    check_host(buf, "all_reduce", "buf");
    auto request = start("all_reduce", buf, {buf});
    const MPI_Datatype type = mpi_datatype(buf.dtype());
    const MPI_Op reduce = mpi_op(*ops_, buf.dtype(), op);
    for_each_piece(buf.numel(), piece(buf.dtype()), [&](int64_t first, int count) {
      MANTISSA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, element(buf, first), count, type, reduce,
                                        comm_.get(), request->add()));
    });
    request->issued();
    return request;
  }

  // In one MPI call while the whole send buffer fits a piece; beyond, as one reduce per rank's
  // chunk and piece, rooted at the rank that receives it.
  RequestPtr reduce_scatter(const Tensor& send, Tensor& recv, const std::vector<int64_t>& counts,
                            ReduceOp op) override {
    check_host(send, "reduce_scatter", "send");
    check_host(recv, "reduce_scatter", "recv");
    check_chunk_counts("MPI reduce_scatter", send, counts, size_);
    MANTISSA_CHECK(recv.dtype() == send.dtype() && recv.numel() == counts[rank_],
                   "MPI reduce_scatter: recv " << recv.describe() << " must hold " << counts[rank_]
                                               << " elements of send's dtype");
    auto request = start("reduce_scatter", send, {send, recv});
    const MPI_Datatype type = mpi_datatype(send.dtype());
    const MPI_Op reduce = mpi_op(*ops_, send.dtype(), op);
    const int64_t piece_size = piece(send.dtype());
    if (send.numel() <= piece_size) {
      MANTISSA_MPI_CHECK(MPI_Ireduce_scatter(send.data(), recv.data(), int_vector(counts).data(),
                                             type, reduce, comm_.get(), request->add()));
    } else {
      const std::vector<int64_t> offsets = chunk_offsets(counts);
      for (int root = 0; root < size_; ++root) {
        for_each_piece(counts[root], piece_size, [&](int64_t first, int count) {
          void* out = root == rank_ ? element(recv, first) : nullptr;
          MANTISSA_MPI_CHECK(MPI_Ireduce(element(send, offsets[root] + first), out, count, type,
                                         reduce, root, comm_.get(), request->add()));
        });
      }
    }
    request->issued();
    return request;
  }

  // In one MPI call while the whole receive buffer fits a piece; beyond, as one broadcast per
  // rank's chunk and piece, from the rank that owns it.
  RequestPtr all_gather(const Tensor& send, Tensor& recv,
                        const std::vector<int64_t>& counts) override {
    check_host(send, "all_gather", "send");
    check_host(recv, "all_gather", "recv");
    check_chunk_counts("MPI all_gather", recv, counts, size_);
    MANTISSA_CHECK(send.dtype() == recv.dtype() && send.numel() == counts[rank_],
                   "MPI all_gather: send " << send.describe() << " must hold " << counts[rank_]
                                           << " elements of recv's dtype");
    const std::vector<int64_t> offsets = chunk_offsets(counts);
    char* mine = element(recv, offsets[rank_]);
    auto request = start("all_gather", recv, {send, recv});
    const MPI_Datatype type = mpi_datatype(recv.dtype());
    const int64_t piece_size = piece(recv.dtype());
    if (recv.numel() <= piece_size) {
      const std::vector<int> c = int_vector(counts);
      const std::vector<int> d = int_vector({offsets.begin(), offsets.end() - 1});
      MANTISSA_MPI_CHECK(MPI_Iallgatherv(send.data() == mine ? MPI_IN_PLACE : send.data(), c[rank_],
                                         type, recv.data(), c.data(), d.data(), type, comm_.get(),
                                         request->add()));
    } else {
      if (send.data() != mine && send.nbytes() > 0) std::memcpy(mine, send.data(), send.nbytes());
      for (int root = 0; root < size_; ++root) {
        for_each_piece(counts[root], piece_size, [&](int64_t first, int count) {
          MANTISSA_MPI_CHECK(MPI_Ibcast(element(recv, offsets[root] + first), count, type, root,
                                        comm_.get(), request->add()));
        });
      }
    }
    request->issued();
    return request;
  }

  RequestPtr broadcast(Tensor& buf, int root) override {
    check_host(buf, "broadcast", "buf");
    MANTISSA_CHECK(root >= 0 && root < size_, "MPI broadcast: root " << root << " out of range");
    auto request = start("broadcast", buf, {buf});
    const MPI_Datatype type = mpi_datatype(buf.dtype());
    for_each_piece(buf.numel(), piece(buf.dtype()), [&](int64_t first, int count) {
      MANTISSA_MPI_CHECK(
          MPI_Ibcast(element(buf, first), count, type, root, comm_.get(), request->add()));
    });
    request->issued();
    return request;
  }

  // Point-to-point messages of at most a piece each, as MPI libraries implement alltoallv
  // (no collective call: whether one would fit an int depends on counts only this rank
  // knows). Messages between two ranks on one communicator and tag arrive in the order they
  // were sent, and both ends cut a chunk into the same pieces, so the k-th receive from a
  // rank gets its k-th send. Each all_to_all has its own tag (all ranks start them in the same
  // order), so the pieces of one whose counts disagree across ranks never reach the next.
  RequestPtr all_to_all(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                        const std::vector<int64_t>& recv_counts) override {
    check_host(send, "all_to_all", "send");
    check_host(recv, "all_to_all", "recv");
    check_all_to_all_counts("MPI all_to_all", send, send_counts, recv, recv_counts, size_, rank());
    MANTISSA_CHECK(send.dtype() == recv.dtype(), "MPI all_to_all: send "
                                                     << send.describe() << " and recv "
                                                     << recv.describe() << " differ in dtype");
    auto request = start("all_to_all", send, {send, recv});
    const MPI_Datatype type = mpi_datatype(send.dtype());
    const std::vector<int64_t> send_offsets = chunk_offsets(send_counts);
    const std::vector<int64_t> recv_offsets = chunk_offsets(recv_counts);
    const int64_t piece_size = piece(send.dtype());
    const int tag = next_all_to_all_tag_;
    next_all_to_all_tag_ = (next_all_to_all_tag_ + 1) % kAllToAllTags;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      for_each_piece(recv_counts[peer], piece_size, [&](int64_t first, int count) {
        MANTISSA_MPI_CHECK(MPI_Irecv(element(recv, recv_offsets[peer] + first), count, type, peer,
                                     tag, comm_.get(), request->add()));
      });
    }
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      for_each_piece(send_counts[peer], piece_size, [&](int64_t first, int count) {
        MANTISSA_MPI_CHECK(MPI_Isend(element(send, send_offsets[peer] + first), count, type, peer,
                                     tag, comm_.get(), request->add()));
      });
    }
    if (send_counts[rank_] > 0) {
      std::memcpy(element(recv, recv_offsets[rank_]), element(send, send_offsets[rank_]),
                  static_cast<size_t>(send_counts[rank_]) * core::dtype_size(send.dtype()));
    }
    request->issued();
    return request;
  }

  void barrier() override {
    MpiRequest request(world_, timeout_s_, "MPI barrier", progress_);
    MANTISSA_MPI_CHECK(MPI_Ibarrier(comm_.get(), request.add()));
    request.issued();
    request.wait();
  }

 private:
  // A request named after `buf`, holding `operands` until it completes (see Request).
  std::unique_ptr<MpiRequest> start(const char* op, const Tensor& buf,
                                    std::vector<Tensor> operands) {
    std::ostringstream what;
    what << "MPI " << op << " of " << buf.describe();
    auto request = std::make_unique<MpiRequest>(world_, timeout_s_, what.str(), progress_);
    request->hold(std::move(operands));
    return request;
  }

  // The most elements of `dtype` one MPI call moves.
  int64_t piece(DType dtype) const {
    return std::max<int64_t>(1, max_piece_bytes_ / static_cast<int64_t>(core::dtype_size(dtype)));
  }

  // all_to_all's point-to-point messages (the only ones on this communicator) cycle through
  // the tags every MPI library provides (MPI_TAG_UB is at least 32767).
  static constexpr int kAllToAllTags = 32768;

  const World& world_;
  double timeout_s_;
  int64_t max_piece_bytes_;
  CommHandle comm_;
  std::shared_ptr<const ReducedOps> ops_;
  std::shared_ptr<MpiProgress> progress_;  // shared by the duplicates; null: none
  int rank_ = 0;
  int size_ = 1;
  int next_all_to_all_tag_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const World& world, double timeout_s,
                                                    int64_t max_piece_bytes) {
  MANTISSA_CHECK(timeout_s > 0, "dist.timeout_s must be > 0, got " << timeout_s);
  MANTISSA_CHECK(
      max_piece_bytes > 0 && max_piece_bytes <= INT_MAX,
      "MPI communicator: max_piece_bytes " << max_piece_bytes << " must lie in [1, 2^31 - 1]");
  return std::make_unique<MpiCommunicator>(world, timeout_s, max_piece_bytes, MPI_COMM_WORLD,
                                           std::make_shared<const ReducedOps>(),
                                           MpiProgress::start());
}

}  // namespace mantissa::dist
