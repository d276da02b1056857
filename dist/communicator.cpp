#include "dist/communicator.h"

#include <utility>

namespace mantissa::dist {

bool Request::test() {
  if (!poll()) return false;
  held_.clear();
  return true;
}

void Request::wait() {
  wait_until_done();
  held_.clear();
}

void Request::hold(std::vector<core::Tensor> tensors) {
  held_ = std::move(tensors);
}

std::vector<int64_t> chunk_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

}  // namespace mantissa::dist
