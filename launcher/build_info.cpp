#include "launcher/build_info.h"

#include <google/protobuf/stubs/common.h>

#include "build_commit.h"  // generated: MANTISSA_COMMIT
#include "core/ops/backend.h"
#include "core/ops/cpu_switches.h"
#include "dist/nccl/nccl_communicator.h"
#include "dist/world.h"

namespace mantissa::launcher {

std::string build_version() {
  return MANTISSA_VERSION;
}

std::string build_commit() {
  return MANTISSA_COMMIT;
}

std::string build_name() {
  return "mantissa " + build_version() + " (commit " + build_commit() + ")";
}

std::string version_report() {
  return build_name() + "\nbuild type: " + MANTISSA_BUILD_TYPE +
         "\nCUDA backend: " + core::cuda_libraries_description() +
         "\nNCCL: " + dist::nccl_version_description() + "\nMPI: " + dist::mpi_library_version() +
         "\nprotobuf: " + google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION) +
         "\n" + core::cpu_paths_description() + "\n";
}

}  // namespace mantissa::launcher
