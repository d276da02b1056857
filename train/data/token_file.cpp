#include "train/data/token_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace mantissa::train {

TokenFile::TokenFile(std::string path, int fd, int64_t size)
    : path_(std::move(path)), fd_(fd), size_(size) {}

TokenFile::~TokenFile() {
  ::close(fd_);
}

int64_t TokenFile::size_now() const {
  struct stat st {};
  return ::fstat(fd_, &st) == 0 ? st.st_size : -1;
}

void TokenFile::read(int64_t offset, std::span<char> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const auto at = static_cast<off_t>(offset + static_cast<int64_t>(done));
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, at);
    if (n < 0 && errno == EINTR) continue;
    MANTISSA_REQUIRE(n >= 0, kFailure,
                     "token shard '" << path_ << "': read at byte " << at
                                     << " failed: " << std::strerror(errno));
    MANTISSA_REQUIRE(n > 0, kConfig,
                     "token shard '" << path_ << "' holds " << size_now() << " bytes, " << size_
                                     << " when the run opened it (a read at byte " << at
                                     << " found its end): it was cut or rewritten while the run "
                                     << "read it (replace shards by moving new files into place, "
                                     << "as mantissa tokenize encode does)");
    done += static_cast<size_t>(n);
  }
}

}  // namespace mantissa::train
