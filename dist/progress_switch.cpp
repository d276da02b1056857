#include "dist/progress_switch.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mantissa::dist {

bool mpi_progress_thread_on() {
  constexpr const char* kVariable = "MANTISSA_MPI_PROGRESS_THREAD";
  const char* value = std::getenv(kVariable);
  if (value == nullptr) return true;
  const std::string setting(value);
  if (setting != "0" && setting != "1") {
    throw core::Error(std::string(kVariable) + "=" + setting +
                      ": must be 0 (off) or 1 (on, the default)");
  }
  return setting == "1";
}

}  // namespace mantissa::dist
