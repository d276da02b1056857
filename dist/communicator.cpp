#include "dist/communicator.h"

#include <utility>

#include "core/error.h"

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

void check_chunk_counts(std::string_view op, const core::Tensor& buf,
                        const std::vector<int64_t>& counts, int size) {
  MANTISSA_CHECK(static_cast<int>(counts.size()) == size,
                 op << ": " << counts.size() << " counts for " << size << " ranks");
  for (int64_t count : counts) MANTISSA_CHECK(count >= 0, op << ": negative count " << count);
  const int64_t total = chunk_offsets(counts).back();
  MANTISSA_CHECK(total == buf.numel(), op << ": counts add up to " << total
                                          << " elements, the buffer " << buf.describe() << " has "
                                          << buf.numel());
}

void check_all_to_all_counts(std::string_view op, const core::Tensor& send,
                             const std::vector<int64_t>& send_counts, const core::Tensor& recv,
                             const std::vector<int64_t>& recv_counts, int size, int rank) {
  check_chunk_counts(op, send, send_counts, size);
  check_chunk_counts(op, recv, recv_counts, size);
  MANTISSA_CHECK(send_counts[rank] == recv_counts[rank],
                 op << ": this rank sends itself " << send_counts[rank] << " elements but receives "
                    << recv_counts[rank]);
}

}  // namespace mantissa::dist
