// Communicator over NCCL on device buffers of one GPU per rank (see dist/communicator.h).
//
// Built when the build has CUDA (NCCL comes with the toolkit); elsewhere
// make_nccl_communicator() throws. Fault tolerance follows NCCL's own recipe: communicators
// are created non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the host;
// every wait polls the completion event and ncclCommGetAsyncError against the timeout, and a
// timeout or an asynchronous error aborts the communicator (ncclCommAbort) before the job
// ends. Rank 0's ncclUniqueId reaches the others by an MPI broadcast.
//
// Collectives run on a stream of their own, after the work already queued on the backend's
// stream (an event orders them), so reductions overlap the rest of backward. Sums are NCCL's:
// BF16/F16 and FP8 (sm_90 and newer) round at every hop like the MPI path.
#pragma once

#include <memory>

#include "core/ops/backend.h"
#include "dist/communicator.h"
#include "dist/world.h"

namespace mantissa::dist {

// `backend` must be the CUDA backend of this rank's GPU.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, core::Backend& backend,
                                                     double timeout_s);

}  // namespace mantissa::dist
