// Communicator over NCCL on device buffers of one GPU per rank (see dist/communicator.h).
//
// Built when the build has CUDA and NCCL (which comes with the toolkit); elsewhere
// make_nccl_communicator() throws. Fault tolerance follows NCCL's own recipe: communicators
// are created non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the host;
// every wait polls the completion event and ncclCommGetAsyncError against the timeout. An
// asynchronous error, a CUDA error or a collective that failed to enqueue aborts the
// communicator (ncclCommAbort); a timeout ends the job through the NcclJob first, else aborts.
//
// The communicator needs no MPI itself: how rank 0's ncclUniqueId reaches the other ranks,
// and how a timeout ends the job, come from the NcclJob it is given (an MPI broadcast and
// World's abort in a job started by mpirun or srun, see dist/make_data_parallel.cpp; nothing
// at all for one process).
//
// Collectives run on a stream of their own, after the work already queued on the backend's
// stream (an event orders them), so reductions overlap the rest of backward; and after the
// collective issued before them on any duplicate() of the same communicator, so that the GPU
// runs a job's collectives in the order the host issued them, the same on every rank (kernels
// of different communicators started in different orders could wait on each other for ever).
// Sums are NCCL's:
// BF16/F16 and FP8 (sm_90 and newer) round at every hop like the MPI path.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/ops/backend.h"
#include "dist/communicator.h"

namespace mantissa::dist {

// This process's place in the job, and the two things the NCCL communicator cannot do alone.
struct NcclJob {
  int rank = 0;
  int size = 1;
  // Makes `bytes` on every rank equal to rank 0's (the ncclUniqueId). Called only when
  // size > 1; collective.
  std::function<void(std::span<std::byte> bytes)> broadcast_from_rank0;
  // A wait ran past the timeout. World's version names the unresponsive ranks and ends the
  // job; when it is empty or returns, the communicator is aborted and the wait throws
  // core::Error instead.
  std::function<void(const std::string& what, double waited_s)> on_timeout;
  // Ends the job where nothing may throw (a destructor). When empty: the message goes to
  // stderr and the process exits with exit_code.
  std::function<void(int exit_code, const std::string& message)> abort;
};

// `backend` must be the CUDA backend of this rank's GPU. Collective over the job's ranks.
std::unique_ptr<Communicator> make_nccl_communicator(NcclJob job, core::Backend& backend,
                                                     double timeout_s);

// For `mantissa --version`: the version of the NCCL library this process loaded, or why there
// is none.
std::string nccl_version_description();

}  // namespace mantissa::dist
