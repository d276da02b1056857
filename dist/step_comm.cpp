#include "dist/step_comm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mantissa::dist {

using core::DType;
using core::Shape;
using core::Tensor;
using Clock = std::chrono::steady_clock;

StepComm::StepComm(core::Backend& backend, std::unique_ptr<Communicator> ctrl,
                   std::unique_ptr<Communicator> host_scalars)
    : backend_(backend), ctrl_(std::move(ctrl)), host_scalars_(std::move(host_scalars)) {
  MANTISSA_CHECK(!host_scalars_ ||
                     (host_scalars_->device().is_cpu() && host_scalars_->size() == ctrl_->size() &&
                      host_scalars_->rank() == ctrl_->rank()),
                 "StepComm: the scalars' communicator must be a host one of the same ranks");
}

void StepComm::open_step() {
  if (step_open_) return;
  step_open_ = true;
  seconds_ = 0.0;
  bytes_ = 0;
}

void StepComm::timed_wait(RequestPtr request, size_t bytes) {
  const auto start = Clock::now();
  request->wait();
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  bytes_ += static_cast<int64_t>(bytes);
}

Tensor StepComm::copy_to(core::Device device, const Tensor& host) {
  if (device.is_cpu()) return host;
  Tensor buf = Tensor::empty(host.shape(), host.dtype(), device);
  backend_.copy(host, buf);
  backend_.synchronize();
  return buf;
}

void StepComm::copy_back(const Tensor& buf, Tensor& host) {
  if (buf.data() == host.data()) return;
  backend_.copy(buf, host);
  backend_.synchronize();
}

void StepComm::max_across_ranks(std::vector<float>& values) {
  if (values.empty()) return;
  // MPI's MAX may drop a NaN (every comparison with it is false): reduce it as +inf.
  for (float& v : values) v = std::isnan(v) ? INFINITY : v;
  Tensor host =
      Tensor::wrap(values.data(), Shape{static_cast<int64_t>(values.size())}, DType::kF32);
  Communicator& comm = scalars();
  Tensor buf = copy_to(comm.device(), host);
  timed_wait(comm.all_reduce(buf, ReduceOp::kMax), buf.nbytes());
  copy_back(buf, host);
}

double StepComm::sum_across_ranks(double value) {
  // Gather every rank's value and add them in rank order, so that every rank holds the same
  // bits (an all-reduce may combine in a rank-dependent order).
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  double sum = 0.0;
  for (int64_t b : all_gather_host(std::span<const int64_t>(&bits, 1))) {
    double v;
    std::memcpy(&v, &b, sizeof v);
    sum += v;
  }
  return sum;
}

std::vector<int64_t> StepComm::all_gather_host(std::span<const int64_t> mine) {
  Communicator& comm = scalars();
  const int64_t words = static_cast<int64_t>(mine.size());
  std::vector<int64_t> all(static_cast<size_t>(words * comm.size()));
  std::copy(mine.begin(), mine.end(), all.begin() + words * comm.rank());
  Tensor host = Tensor::wrap(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::kI64);
  Tensor buf = copy_to(comm.device(), host);
  Tensor slot = buf.view(words * comm.rank(), Shape{words});
  timed_wait(
      comm.all_gather(slot, buf, std::vector<int64_t>(static_cast<size_t>(comm.size()), words)),
      mine.size_bytes());
  copy_back(buf, host);
  return all;
}

}  // namespace mantissa::dist
