// A file or directory of this fuzz process under the system's temporary directory, named
// <stem>_<pid><extension>, removed with everything in it when the process exits normally (the
// corpus driver's return from main, libFuzzer's exit after its runs). Held as a function-local
// static by the harnesses that must hand a loader a real path.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace mantissa::fuzz {

class ProcessScratch {
 public:
  ProcessScratch(const std::string& stem, const std::string& extension = "")
      : path_((std::filesystem::temp_directory_path() /
               (stem + "_" + std::to_string(::getpid()) + extension))
                  .string()) {}
  ~ProcessScratch() {
    std::error_code ignored;  // nothing to report at exit; a leftover is all that can go wrong
    std::filesystem::remove_all(path_, ignored);
  }
  ProcessScratch(const ProcessScratch&) = delete;
  ProcessScratch& operator=(const ProcessScratch&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace mantissa::fuzz
