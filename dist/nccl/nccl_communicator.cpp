#include "dist/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <sstream>

#include "core/error.h"
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_handles.h"
#include "dist/poll_wait.h"

// NCCL calls on a non-blocking communicator may answer ncclInProgress: the call was accepted
// and completes asynchronously (wait_ready() polls for it). Anything else is an error that
// names the call, NCCL's description, its last error text, the rank and the location.
#define MANTISSA_NCCL_CHECK(call, comm, rank)                                                     \
  do {                                                                                            \
    const ncclResult_t mantissa_nccl_status = (call);                                             \
    MANTISSA_CHECK(mantissa_nccl_status == ncclSuccess || mantissa_nccl_status == ncclInProgress, \
                   #call << " failed on rank " << (rank) << ": "                                  \
                         << ncclGetErrorString(mantissa_nccl_status) << " ("                      \
                         << ncclGetLastError(comm) << ")");                                       \
  } while (0)

namespace mantissa::dist {
namespace {

using core::DType;
using core::Tensor;
using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kE4M3: return ncclFloat8e4m3;  // reductions need sm_90 or newer
    case DType::kE5M2: return ncclFloat8e5m2;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  MANTISSA_FAIL("NCCL communicator: unsupported dtype " << core::dtype_name(dtype));
}

// The datatype of a collective that only moves data (gather, broadcast, send/recv). FP8 moves
// as bytes: NCCL checks its FP8 types against sm_90 ("FP8 reduction support begins with sm90"),
// and users report the refusal for all-gathers too, though nothing is summed.
ncclDataType_t nccl_copy_dtype(DType dtype) {
  return dtype == DType::kE4M3 || dtype == DType::kE5M2 ? ncclUint8 : nccl_dtype(dtype);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

// Ends the job from where nothing may throw (a destructor), as the job asks.
[[noreturn]] void abort_job(const NcclJob& job, int exit_code, const std::string& message) {
  if (job.abort) job.abort(exit_code, message);
  std::fprintf(stderr, "mantissa: rank %d: %s\n", job.rank, message.c_str());
  std::fflush(stderr);
  std::_Exit(exit_code);
}

// One NCCL communicator, created non-blocking. It is destroyed politely when idle
// (ncclCommFinalize, then ncclCommDestroy) and aborted when an operation failed or timed
// out, since then nothing it has in flight can be trusted to finish. ncclCommAbort frees the
// communicator, so the handle is dropped with it: every later use fails with a message
// instead of touching freed memory.
class NcclComm {
 public:
  NcclComm(std::shared_ptr<const NcclJob> job, double timeout_s)
      : job_(std::move(job)), timeout_s_(timeout_s) {}
  ~NcclComm() {
    if (comm_ == nullptr) return;
    // Destroyed while a failure unwinds the stack on its way to ending the job. Finalizing
    // would wait up to timeout_s for peers that may never come, once for each of the job's
    // communicators. A job of several ranks ends by the job's abort (main's), which
    // ncclCommAbort must not delay: it can hang while a collective waits for a lost peer. One
    // process has no peer to wait for: abort at once.
    if (std::uncaught_exceptions() > 0) {
      if (!job_ends_on_failure()) abort();
      return;
    }
    // On a non-blocking communicator ncclCommFinalize answers ncclInProgress while it flushes
    // outstanding work; ncclCommGetAsyncError reports ncclSuccess once it is done.
    ncclResult_t state = ncclCommFinalize(comm_);
    const bool settled = poll_for(
        [&] {
          if (state == ncclInProgress && ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
            state = ncclInternalError;
          }
          return state != ncclInProgress;
        },
        timeout_s_);
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
      return;
    }
    if (settled) {
      std::fprintf(stderr,
                   "mantissa: rank %d: closing an NCCL communicator failed (%s); aborted it\n",
                   rank(), ncclGetErrorString(state));
    } else {
      std::fprintf(stderr,
                   "mantissa: rank %d: closing an NCCL communicator took over %g s "
                   "(dist.timeout_s); aborted it\n",
                   rank(), timeout_s_);
    }
    abort();
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t* out() { return &comm_; }
  // A job of several ranks that the job's abort ends on a failure (World's MPI_Abort): it is
  // ended first, before any ncclCommAbort, which can itself hang while a collective of this or
  // another communicator of the job waits for a lost peer (NCCL aborts a split family parent
  // first, and says any of them may hang).
  bool job_ends_on_failure() const { return job_->size > 1 && static_cast<bool>(job_->abort); }
  // An earlier failure or timeout aborted the communicator (see abort()).
  bool aborted() const { return comm_ == nullptr; }
  const std::shared_ptr<const NcclJob>& job() const { return job_; }
  int rank() const { return job_->rank; }
  ncclComm_t get() const {
    MANTISSA_CHECK(comm_ != nullptr, "NCCL communicator on rank "
                                         << rank() << " was aborted after an earlier failure");
    return comm_;
  }

  // Polls until the communicator has no operation being enqueued (after a call that
  // answered ncclInProgress). Throws on an asynchronous error or a timeout.
  void wait_ready(const std::string& what) {
    poll_until([&] { return async_ready(what); }, timeout_s_,
               [&](double waited_s) { timed_out(what, waited_s); });
  }

  // Whether the communicator has no operation being enqueued; throws on its asynchronous
  // error. That error is the communicator's, not one call's: `what`, the call in progress when
  // it was seen, may be its cause or may not (an earlier collective still in flight may be).
  bool async_ready(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    MANTISSA_NCCL_CHECK(ncclCommGetAsyncError(get(), &state), comm_, rank());
    check_result(state, "the communicator reported an error during " + what +
                            " (its cause may be an earlier collective still in flight)");
    return state == ncclSuccess;
  }

  // When `result` is an error, `what` saying what failed: ends the job (job_ends_on_failure),
  // else aborts the communicator and throws.
  void check_result(ncclResult_t result, const std::string& what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail("NCCL on rank " + std::to_string(rank()) + ": " + what + ": " +
         ncclGetErrorString(result) + " (" + ncclGetLastError(comm_) + ")");
  }

  // A failure of this communicator or of its stream's work: ends the job with `message`
  // (job_ends_on_failure), else aborts the communicator and throws core::Error.
  [[noreturn]] void fail(const std::string& message) {
    if (job_ends_on_failure()) abort_job(*job_, 1, message);
    abort();
    MANTISSA_FAIL(message);
  }

  // The job's on_timeout comes first: it names the silent ranks and ends the job, and
  // ncclCommAbort can itself hang while another communicator's kernels wait for a lost peer.
  [[noreturn]] void timed_out(const std::string& what, double waited_s) {
    if (job_->on_timeout) job_->on_timeout("NCCL " + what, waited_s);
    abort();
    MANTISSA_FAIL("NCCL " << what << " on rank " << rank() << " did not complete within "
                          << waited_s << " s");
  }

  // Ends the communicator after a failure; nothing it has in flight is waited for.
  void abort() {
    if (comm_ == nullptr) return;
    if (const ncclResult_t result = ncclCommAbort(comm_); result != ncclSuccess) {
      std::fprintf(stderr, "mantissa: rank %d: ncclCommAbort failed: %s\n", rank(),
                   ncclGetErrorString(result));
    }
    comm_ = nullptr;
    aborted_at_ = Clock::now();
  }

  // After abort(): waits for `stream` (the communicator's) to drain, so that the buffers of a
  // collective in flight go back only once nothing uses them. ncclCommAbort ends the
  // collectives, so it drains soon; all requests together wait at most timeout_s from the
  // abort, then the buffers go back regardless (the job is failing), said once.
  void drain(cudaStream_t stream) {
    const double left =
        timeout_s_ - std::chrono::duration<double>(Clock::now() - aborted_at_).count();
    if (poll_for([&] { return cudaStreamQuery(stream) != cudaErrorNotReady; }, left)) return;
    if (!drain_timed_out_) {
      std::fprintf(stderr,
                   "mantissa: rank %d: the NCCL stream still ran %g s after its communicator "
                   "was aborted; the buffers of its collectives are released regardless\n",
                   rank(), timeout_s_);
    }
    drain_timed_out_ = true;
  }

 private:
  std::shared_ptr<const NcclJob> job_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  Clock::time_point aborted_at_;
  bool drain_timed_out_ = false;
};

// Complete when the event recorded after the operation on the communicator's stream has
// fired; NCCL's asynchronous errors are checked on every poll.
class NcclRequest final : public Request {
 public:
  NcclRequest(NcclComm& comm, cudaStream_t stream, cudaStream_t backend_stream, double timeout_s,
              std::string what)
      : comm_(comm),
        stream_(stream),
        backend_stream_(backend_stream),
        timeout_s_(timeout_s),
        what_(std::move(what)) {}
  // A request dropped while in flight (an exception unwinding a step) still owns buffers the
  // GPU is using: wait for it, and end the job rather than throw from a destructor.
  ~NcclRequest() override {
    if (done_) return;
    if (std::uncaught_exceptions() > 0 && comm_.job_ends_on_failure()) {
      // A failure unwinds towards the job's abort (main's), which waiting here or aborting
      // the communicator (it can hang on a lost peer) would only delay; the abort ends what
      // is in flight, and no work follows that could reuse the buffers.
      return;
    }
    // Its done event was never recorded: enqueueing the collective failed part way (an NCCL
    // call, a group's end, the event record threw), and an unrecorded event counts as fired
    // while what was enqueued may still run. Nothing can wait for that: abort.
    if (!recorded_) comm_.abort();
    if (comm_.aborted()) {
      // The failure that aborted the communicator is being reported already (the exception
      // unwinding through here, or the job's on_timeout): wait() would throw "was aborted"
      // and end the process under that message instead, hiding the cause.
      comm_.drain(stream_);
      return;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      abort_job(*comm_.job(), 1, e.what());
    }
  }

  // After the collective is enqueued on the communicator's stream.
  void record_done() {
    MANTISSA_CUDA_CHECK(cudaEventRecord(done_event_.get(), stream_));
    recorded_ = true;
  }
  const std::string& what() const { return what_; }

  // The backend's stream waits for the done event on the GPU; the host goes on.
  void order_backend_after() override {
    MANTISSA_CUDA_CHECK(cudaStreamWaitEvent(backend_stream_, done_event_.get(), 0));
  }

 protected:
  bool poll() override {
    if (done_) return true;
    comm_.async_ready(what_);
    const cudaError_t query = cudaEventQuery(done_event_.get());
    if (query == cudaErrorNotReady) return false;
    if (query != cudaSuccess) {
      // A kernel failed (on any stream: CUDA's errors are sticky). The peers must not wait
      // out the timeout for this rank's part: end the job, or abort the communicator.
      comm_.fail("NCCL " + what_ + " on rank " + std::to_string(comm_.rank()) +
                 ": CUDA error: " + cudaGetErrorString(query));
    }
    done_ = true;
    return true;
  }

  void wait_until_done() override {
    poll_until([this] { return poll(); }, timeout_s_,
               [this](double waited_s) { comm_.timed_out(what_, waited_s); });
  }

 private:
  NcclComm& comm_;
  cudaStream_t stream_;          // the communicator's, which outlives its requests
  cudaStream_t backend_stream_;  // the backend's, which outlives them too
  double timeout_s_;
  std::string what_;
  core::CudaEvent done_event_{cudaEventDisableTiming};
  bool recorded_ = false;
  bool done_ = false;
};

// The one order, on the GPU, of every collective of a communicator and its duplicates. NCCL
// kernels of different communicators run on streams of their own and spin until their peers
// join: started in different orders on different ranks (which the GPU's scheduler may do,
// however the host issued them), they can wait on each other for ever. Before NCCL 2.26 the
// documented remedy is a total order through stream dependencies, and from 2.26 it is still
// needed unless NCCL_LAUNCH_ORDER_IMPLICIT is set. So each collective's stream first waits for
// the one issued before it, on whichever communicator of the family: the host issues them in
// the same order on every rank (the pipeline's rule, dist/bucketed_grad_sync.cpp), and the GPU
// now runs them in that order too. The shared event marks the last collective enqueued; before
// the first it holds no work (cudaEventRecord's documentation), so the first wait passes.
using LaunchOrder = core::CudaEvent;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(core::CudaBackend& backend, double timeout_s, std::unique_ptr<NcclComm> comm,
                   std::shared_ptr<LaunchOrder> order)
      : backend_(backend), timeout_s_(timeout_s), comm_(std::move(comm)), order_(std::move(order)) {
    MANTISSA_NCCL_CHECK(ncclCommCount(comm_->get(), &size_), comm_->get(), comm_->rank());
  }

  int rank() const override { return comm_->rank(); }
  int size() const override { return size_; }
  core::Device device() const override { return backend_.device(); }
  bool runs_in_order() const override { return true; }

  std::unique_ptr<Communicator> duplicate() override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto child = std::make_unique<NcclComm>(comm_->job(), timeout_s_);
    MANTISSA_NCCL_CHECK(ncclCommSplit(comm_->get(), 0, rank(), child->out(), &config), comm_->get(),
                        rank());
    comm_->wait_ready("ncclCommSplit");
    child->wait_ready("ncclCommSplit");
    return std::make_unique<NcclCommunicator>(backend_, timeout_s_, std::move(child), order_);
  }

  RequestPtr all_reduce(Tensor& buf, ReduceOp op) override {
    check_device(buf, "all_reduce");
    auto request = begin("all_reduce", buf, {buf});
    MANTISSA_NCCL_CHECK(
        ncclAllReduce(buf.data(), buf.data(), static_cast<size_t>(buf.numel()),
                      nccl_dtype(buf.dtype()), nccl_op(op), comm_->get(), stream_.get()),
        comm_->get(), rank());
    return end(std::move(request));
  }

  RequestPtr reduce_scatter(const Tensor& send, Tensor& recv, const std::vector<int64_t>& counts,
                            ReduceOp op) override {
    check_device(send, "reduce_scatter");
    check_device(recv, "reduce_scatter");
    check_chunk_counts("NCCL reduce_scatter", send, counts, size_);
    MANTISSA_CHECK(recv.dtype() == send.dtype() && recv.numel() == counts[rank()],
                   "NCCL reduce_scatter: recv " << recv.describe() << " must hold "
                                                << counts[rank()] << " elements of send's dtype");
    auto request = begin("reduce_scatter", send, {send, recv});
    const ncclDataType_t type = nccl_dtype(send.dtype());
    if (equal(counts)) {
      MANTISSA_NCCL_CHECK(
          ncclReduceScatter(send.data(), recv.data(), static_cast<size_t>(counts[0]), type,
                            nccl_op(op), comm_->get(), stream_.get()),
          comm_->get(), rank());
    } else {
      // Unequal chunks: one reduce per chunk, rooted at its owner, fused in a group.
      const std::vector<int64_t> offsets = chunk_offsets(counts);
      Group group(*this);
      for (int r = 0; r < size_; ++r) {
        if (counts[r] == 0) continue;
        const void* chunk = element(send, offsets[r]);
        MANTISSA_NCCL_CHECK(ncclReduce(chunk, r == rank() ? recv.data() : const_cast<void*>(chunk),
                                       static_cast<size_t>(counts[r]), type, nccl_op(op), r,
                                       comm_->get(), stream_.get()),
                            comm_->get(), rank());
      }
      group.end("reduce_scatter");
    }
    return end(std::move(request));
  }

  RequestPtr all_gather(const Tensor& send, Tensor& recv,
                        const std::vector<int64_t>& counts) override {
    check_device(send, "all_gather");
    check_device(recv, "all_gather");
    check_chunk_counts("NCCL all_gather", recv, counts, size_);
    MANTISSA_CHECK(send.dtype() == recv.dtype() && send.numel() == counts[rank()],
                   "NCCL all_gather: send " << send.describe() << " must hold " << counts[rank()]
                                            << " elements of recv's dtype");
    auto request = begin("all_gather", recv, {send, recv});
    const ncclDataType_t type = nccl_copy_dtype(recv.dtype());
    const std::vector<int64_t> offsets = chunk_offsets(counts);
    if (equal(counts)) {
      // In place when send is this rank's chunk of recv, which NCCL supports as such.
      MANTISSA_NCCL_CHECK(ncclAllGather(send.data(), recv.data(), static_cast<size_t>(counts[0]),
                                        type, comm_->get(), stream_.get()),
                          comm_->get(), rank());
    } else {
      // Unequal chunks: one broadcast per chunk from its owner, fused in a group.
      Group group(*this);
      for (int r = 0; r < size_; ++r) {
        if (counts[r] == 0) continue;
        void* chunk = element(recv, offsets[r]);
        MANTISSA_NCCL_CHECK(
            ncclBroadcast(r == rank() ? send.data() : chunk, chunk, static_cast<size_t>(counts[r]),
                          type, r, comm_->get(), stream_.get()),
            comm_->get(), rank());
      }
      group.end("all_gather");
    }
    return end(std::move(request));
  }

  RequestPtr broadcast(Tensor& buf, int root) override {
    check_device(buf, "broadcast");
    MANTISSA_CHECK(root >= 0 && root < size_, "NCCL broadcast: root " << root << " out of range");
    auto request = begin("broadcast", buf, {buf});
    MANTISSA_NCCL_CHECK(
        ncclBroadcast(buf.data(), buf.data(), static_cast<size_t>(buf.numel()),
                      nccl_copy_dtype(buf.dtype()), root, comm_->get(), stream_.get()),
        comm_->get(), rank());
    return end(std::move(request));
  }

  RequestPtr all_to_all(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                        const std::vector<int64_t>& recv_counts) override {
    check_device(send, "all_to_all");
    check_device(recv, "all_to_all");
    check_all_to_all_counts("NCCL all_to_all", send, send_counts, recv, recv_counts, size_, rank());
    MANTISSA_CHECK(send.dtype() == recv.dtype(), "NCCL all_to_all: send "
                                                     << send.describe() << " and recv "
                                                     << recv.describe() << " differ in dtype");
    auto request = begin("all_to_all", send, {send, recv});
    const ncclDataType_t type = nccl_copy_dtype(send.dtype());
    const std::vector<int64_t> send_offsets = chunk_offsets(send_counts);
    const std::vector<int64_t> recv_offsets = chunk_offsets(recv_counts);
    Group group(*this);
    for (int r = 0; r < size_; ++r) {
      if (send_counts[r] > 0) {
        MANTISSA_NCCL_CHECK(
            ncclSend(element(send, send_offsets[r]), static_cast<size_t>(send_counts[r]), type, r,
                     comm_->get(), stream_.get()),
            comm_->get(), rank());
      }
      if (recv_counts[r] > 0) {
        MANTISSA_NCCL_CHECK(
            ncclRecv(element(recv, recv_offsets[r]), static_cast<size_t>(recv_counts[r]), type, r,
                     comm_->get(), stream_.get()),
            comm_->get(), rank());
      }
    }
    group.end("all_to_all");
    return end(std::move(request));
  }

  void barrier() override {
    Tensor token = Tensor::empty(core::Shape{1}, DType::kI32, device());
    backend_.fill(token, 0.0f);
    all_reduce(token, ReduceOp::kMax)->wait();
  }

 private:
  static bool equal(const std::vector<int64_t>& counts) {
    for (int64_t c : counts) {
      if (c != counts[0]) return false;
    }
    return true;
  }

  static void* element(const Tensor& t, int64_t index) {
    return static_cast<char*>(t.data()) + index * static_cast<int64_t>(core::dtype_size(t.dtype()));
  }

  void check_device(const Tensor& t, const char* op) const {
    MANTISSA_CHECK(t.device() == device(),
                   "NCCL " << op << ": " << t.describe() << " is not on " << device().str());
  }

  // The collective must see every write already queued on the backend's stream. The request
  // holds `operands` until it completes (see Request): a tensor the caller drops meanwhile
  // goes back to the caching allocator only once the communicator's stream is done with it.
  std::unique_ptr<NcclRequest> begin(const char* op, const Tensor& buf,
                                     std::vector<Tensor> operands) {
    std::ostringstream what;
    what << op << " of " << buf.describe();
    auto request = std::make_unique<NcclRequest>(*comm_, stream_.get(), backend_.stream(),
                                                 timeout_s_, what.str());
    request->hold(std::move(operands));
    MANTISSA_CUDA_CHECK(cudaEventRecord(ready_.get(), backend_.stream()));
    MANTISSA_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0));
    MANTISSA_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), order_->get(), 0));
    return request;
  }

  RequestPtr end(std::unique_ptr<NcclRequest> request) {
    comm_->wait_ready(request->what());
    request->record_done();
    MANTISSA_CUDA_CHECK(cudaEventRecord(order_->get(), stream_.get()));
    return request;
  }

  // ncclGroupStart .. ncclGroupEnd as a scope: when a call inside the group throws, the
  // destructor still closes the group, so this thread's next NCCL call is not silently
  // swallowed into a group that never ends.
  class Group {
   public:
    explicit Group(NcclCommunicator& owner) : owner_(owner) {
      MANTISSA_NCCL_CHECK(ncclGroupStart(), owner_.comm_->get(), owner_.rank());
    }
    // A call inside the group failed (its error is on its way up). The group must still be
    // ended, which launches the calls queued before the failure without the rest of their
    // pattern, so the communicator is aborted: nothing can wait for those calls.
    ~Group() {
      if (!open_) return;
      ncclGroupEnd();
      // In a job of several ranks the failure ends the job first (job_ends_on_failure).
      if (!owner_.comm_->job_ends_on_failure()) owner_.comm_->abort();
    }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

    // A failed ncclGroupEnd aborts the communicator too (check_result), for the same reason.
    void end(const char* op) {
      open_ = false;
      owner_.comm_->check_result(ncclGroupEnd(), std::string("ncclGroupEnd of ") + op + " failed");
      owner_.comm_->wait_ready(op);
    }

   private:
    NcclCommunicator& owner_;
    bool open_ = true;
  };

  core::CudaBackend& backend_;
  double timeout_s_;
  // Declared before comm_, so the communicator is finalized while its stream still exists.
  core::CudaStream stream_;
  core::CudaEvent ready_{cudaEventDisableTiming};
  std::unique_ptr<NcclComm> comm_;
  std::shared_ptr<LaunchOrder> order_;  // shared with the duplicates
  int size_ = 1;
};

}  // namespace

std::string nccl_version_description() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown (ncclGetVersion failed)";
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since NCCL 2.9.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(NcclJob job, core::Backend& backend,
                                                     double timeout_s) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  MANTISSA_CHECK(cuda != nullptr, "dist.backend NCCL needs the CUDA backend, got a backend on "
                                      << backend.device().str());
  MANTISSA_CHECK(timeout_s > 0, "dist.timeout_s must be > 0, got " << timeout_s);
  MANTISSA_CHECK(job.rank >= 0 && job.rank < job.size,
                 "NCCL communicator: rank " << job.rank << " of " << job.size);
  MANTISSA_CHECK(job.size == 1 || job.broadcast_from_rank0,
                 "NCCL communicator: " << job.size << " ranks need a way to share the unique id");
  MANTISSA_CUDA_CHECK(cudaSetDevice(cuda->device().index));
  // A libnccl older than the headers this was built with may refuse what they offer (FP8
  // datatypes, config fields) with a bare "invalid argument": name both versions first.
  if (int loaded = 0;
      job.rank == 0 && ncclGetVersion(&loaded) == ncclSuccess && loaded < NCCL_VERSION_CODE) {
    std::fprintf(stderr,
                 "mantissa: warning: NCCL %s is loaded, older than the %d.%d.%d this build was "
                 "compiled with: what only the newer one has (FP8 reductions, configuration "
                 "fields) may be refused\n",
                 nccl_version_description().c_str(), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  }

  // Rank 0's unique id reaches every rank through the job (an MPI broadcast).
  ncclUniqueId id{};
  if (job.rank == 0) MANTISSA_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, 0);
  if (job.size > 1) job.broadcast_from_rank0(std::as_writable_bytes(std::span(&id, 1)));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no NCCL call may block the host: every wait can time out
  const int rank = job.rank, size = job.size;
  auto comm =
      std::make_unique<NcclComm>(std::make_shared<const NcclJob>(std::move(job)), timeout_s);
  MANTISSA_NCCL_CHECK(ncclCommInitRankConfig(comm->out(), size, id, rank, &config), nullptr, rank);
  comm->wait_ready("ncclCommInitRankConfig");
  return std::make_unique<NcclCommunicator>(*cuda, timeout_s, std::move(comm),
                                            std::make_shared<LaunchOrder>(cudaEventDisableTiming));
}

}  // namespace mantissa::dist
