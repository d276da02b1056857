// An MPI communicator of its own (a duplicate of `parent`, errors returned rather than fatal),
// freed with its owner.
#pragma once

#include <mpi.h>

#include "dist/mpi/mpi_check.h"

namespace mantissa::dist {

class CommHandle {
 public:
  explicit CommHandle(MPI_Comm parent) {
    MANTISSA_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    MANTISSA_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~CommHandle() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace mantissa::dist
