// Communicator over MPI on host buffers (see dist/communicator.h for the semantics).
//
// Reduced-precision sums use user-defined MPI operations over 8- and 16-bit integer
// datatypes that widen to FP32, add and round once per hop with core/dtype/dtype.h's
// conversions (the same bits as the GPU's). Collectives are MPI's non-blocking ones
// (MPI_Iallreduce, ...); waits poll MPI_Testall against the timeout.
//
// MPI counts and displacements are ints, and MPI libraries have had overflow bugs in their
// byte arithmetic past 2^31 bytes. So one MPI call moves at most max_piece_bytes (1 GiB by
// default): a larger collective is issued as several calls on pieces, in the same order on
// every rank, and any buffer an int64 can count works.
#pragma once

#include <cstdint>
#include <memory>

#include "dist/communicator.h"
#include "dist/world.h"

namespace mantissa::dist {

inline constexpr int64_t kMpiMaxPieceBytes = int64_t{1} << 30;

std::unique_ptr<Communicator> make_mpi_communicator(const World& world, double timeout_s,
                                                    int64_t max_piece_bytes = kMpiMaxPieceBytes);

}  // namespace mantissa::dist
