// One interface for every collective that crosses ranks, with two implementations:
//  - MpiCommunicator (dist/mpi/): host buffers; CPUs, and the bootstrap of NCCL.
//  - NcclCommunicator (dist/nccl/): device buffers of one GPU per rank.
//
// Every collective is non-blocking and returns a Request; the caller overlaps it with compute
// and calls test() (which also drives MPI's progress: an MPI collective only moves inside MPI
// calls) or wait(). Every wait is bounded by the communicator's timeout: past it, the job ends
// with a message naming the ranks that stopped answering (World::abort_on_timeout). Nothing
// ever blocks forever.
//
// Numerics of reductions (kSum) by dtype:
//   F32             FP32 additions (the library's order).
//   BF16, F16,      each hop widens both operands to FP32, adds, and rounds once to the dtype
//   E4M3, E5M2      (round to nearest even; FP8 saturates to +-max finite). So a sum over N
//                   ranks rounds N - 1 times, but never accumulates in the narrow type.
// Reductions of a collective are combined in the same order on every rank (reduce-then-
// broadcast, or reduce-scatter-then-all-gather algorithms): all ranks get identical bits.
//
// Collectives on one communicator must be started in the same order on every rank. Pipelines
// whose stages complete at rank-dependent times use one duplicate() per stage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor/tensor.h"

namespace mantissa::dist {

enum class ReduceOp { kSum, kMax };

// A collective in flight. It holds a reference to every tensor it was given (core::Tensor
// copies share their Storage) until it has completed, so a caller may drop its own handles at
// once: the memory is neither freed nor, on a GPU, handed by the caching allocator to a kernel
// on the backend's stream while the communicator's stream still reads or writes it. The
// references go when test() first returns true, when wait() returns, or with the request
// (whose destructor waits for a collective still in flight).
class Request {
 public:
  virtual ~Request() = default;
  // Drives the operation forward; true once it has completed (its buffers are the caller's
  // again). Cheap: call it often while computing.
  bool test();
  // Returns when complete; ends the job after the communicator's timeout.
  void wait();
  // Makes what the caller queues on the backend from now on run after the collective, so that
  // it may read the results: a communicator on a device stream makes the backend's stream wait
  // for the collective there (NCCL), without the host waiting; the others wait() here. The
  // request still completes as before (test() or wait()).
  virtual void order_backend_after() { wait(); }

  // Keeps `tensors` alive until completion (the communicators call it when they start one).
  void hold(std::vector<core::Tensor> tensors);

 protected:
  // test() and wait() of the implementation, without the bookkeeping above.
  virtual bool poll() = 0;
  virtual void wait_until_done() = 0;

 private:
  std::vector<core::Tensor> held_;
};
using RequestPtr = std::unique_ptr<Request>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where buffers must live: host memory (MPI) or this rank's GPU (NCCL).
  virtual core::Device device() const = 0;
  // A communicator over the same ranks whose collectives are matched independently of this
  // one's: each may start its own sequence. (NCCL still runs the collectives of a communicator
  // and its duplicates on the GPU in the order the host started them, which must then be the
  // same on every rank: dist/nccl/nccl_communicator.h.)
  virtual std::unique_ptr<Communicator> duplicate() = 0;
  // Whether its collectives run one after another in the order they were started (NCCL's, on
  // the communicator's stream), so that starting one before the previous has completed neither
  // waits nor competes with it. MPI's progress concurrently.
  virtual bool runs_in_order() const = 0;

  // In place: buf = op over ranks of buf. Floating dtypes; kMax also for I32/I64.
  virtual RequestPtr all_reduce(core::Tensor& buf, ReduceOp op) = 0;
  // send holds size() consecutive chunks of counts[r] elements; this rank receives the
  // reduction of chunk rank() (counts[rank()] elements) into recv.
  virtual RequestPtr reduce_scatter(const core::Tensor& send, core::Tensor& recv,
                                    const std::vector<int64_t>& counts, ReduceOp op) = 0;
  // recv holds size() consecutive chunks of counts[r] elements; chunk r comes from rank r's
  // send (counts[r] elements). send may be this rank's chunk of recv itself (in place).
  virtual RequestPtr all_gather(const core::Tensor& send, core::Tensor& recv,
                                const std::vector<int64_t>& counts) = 0;
  // buf on every rank = buf on `root`.
  virtual RequestPtr broadcast(core::Tensor& buf, int root) = 0;
  // send holds size() consecutive chunks, chunk r (send_counts[r] elements) going to rank r;
  // recv receives size() consecutive chunks, chunk r (recv_counts[r]) from rank r.
  virtual RequestPtr all_to_all(const core::Tensor& send, const std::vector<int64_t>& send_counts,
                                core::Tensor& recv, const std::vector<int64_t>& recv_counts) = 0;
  // Returns once every rank has entered it (bounded by the timeout like any wait).
  virtual void barrier() = 0;
};

// Offsets of consecutive chunks: {0, c0, c0 + c1, ...} (size() + 1 entries).
std::vector<int64_t> chunk_offsets(const std::vector<int64_t>& counts);

// The chunk counts of a collective on `size` ranks over `buf`: one per rank, none negative,
// adding up to buf's elements. Throws core::Error naming `op` ("MPI all_gather").
void check_chunk_counts(std::string_view op, const core::Tensor& buf,
                        const std::vector<int64_t>& counts, int size);
// all_to_all's chunk counts, each list checked as above, and what `rank` sends itself equal to
// what it receives from itself.
void check_all_to_all_counts(std::string_view op, const core::Tensor& send,
                             const std::vector<int64_t>& send_counts, const core::Tensor& recv,
                             const std::vector<int64_t>& recv_counts, int size, int rank);

}  // namespace mantissa::dist
