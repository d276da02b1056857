// Communicator over MPI on host buffers (see dist/communicator.h for the semantics).
//
// Reduced-precision sums use user-defined MPI operations over 8- and 16-bit integer
// datatypes that widen to FP32, add and round once per hop with core/dtype/dtype.h's
// conversions (the same bits as the GPU's). Collectives are MPI's non-blocking ones
// (MPI_Iallreduce, ...); waits poll MPI_Test against the timeout.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "dist/world.h"

namespace mantissa::dist {

std::unique_ptr<Communicator> make_mpi_communicator(const World& world, double timeout_s);

}  // namespace mantissa::dist
