// Every MPI call is checked: a failure throws core::Error naming the call, MPI's own
// description of the error, the rank and the source location. (World sets MPI_ERRORS_RETURN
// on every communicator, so failures come back here instead of aborting inside MPI.)
#pragma once

#include <mpi.h>

#include <string>

#include "core/error.h"

namespace mantissa::dist {

// "MPI_Allreduce failed on rank 2: MPI_ERR_TRUNCATE: message truncated"
std::string mpi_error_message(const char* call, int code);

}  // namespace mantissa::dist

#define MANTISSA_MPI_CHECK(call)                                                     \
  do {                                                                               \
    const int mantissa_mpi_status = (call);                                          \
    MANTISSA_CHECK(mantissa_mpi_status == MPI_SUCCESS,                               \
                   ::mantissa::dist::mpi_error_message(#call, mantissa_mpi_status)); \
  } while (0)
