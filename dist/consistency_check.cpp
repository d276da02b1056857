#include "dist/consistency_check.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/dtype/dtype.h"
#include "core/error.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

// A 64-bit checksum of a buffer's bytes: the sum of a mixed function of each 8-byte word and
// its position, so it parallelises, and a changed, swapped or moved word changes it.
uint64_t checksum(const void* data, size_t nbytes) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const int64_t words = static_cast<int64_t>(nbytes / 8);
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    sum += core::mix64(w ^ core::mix64(static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ULL));
  }
  for (size_t i = static_cast<size_t>(words) * 8; i < nbytes; ++i) {
    sum += core::mix64(bytes[i] + (static_cast<uint64_t>(i) << 8));
  }
  return sum;
}

struct Field {
  const char* name;
  bool hex;  // print as a bit pattern (checksums, float bits)
};

// The fixed record every rank contributes; index i of kFields names entry i.
constexpr Field kFields[] = {{"step", false},
                             {"loss-scaler scale (float bits)", true},
                             {"loss-scaler growth_tracker", false},
                             {"loss-scaler hysteresis_tracker", false},
                             {"loss-scaler overflows_at_min", false},
                             {"loss-scaler overflow_steps_total", false},
                             {"number of FP8 scales", false},
                             {"checksum of the FP8 scales", true},
                             {"optimizer steps", false},
                             {"checksum of the FP32 masters", true}};
constexpr size_t kNumFields = sizeof kFields / sizeof kFields[0];
// Under ZeRO-1 the last field covers the compute copy.
constexpr const char* kZero1ReplicaField = "checksum of the compute copy";

}  // namespace

void check_consistency(StepComm& comm, core::Backend& backend, train::ParameterStore& params,
                       bool zero1, const ReplicaState& state) {
  const int n = comm.size();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &state.scaler.scale, sizeof scale_bits);
  Tensor& replicated = zero1 ? params.compute() : params.masters();
  Tensor host = replicated;
  if (!replicated.device().is_cpu()) {
    host = Tensor::empty(replicated.shape(), replicated.dtype());
    backend.copy(replicated, host);
  }
  backend.synchronize();
  std::vector<int64_t> record = {
      state.step,
      scale_bits,
      state.scaler.growth_tracker,
      state.scaler.hysteresis_tracker,
      state.scaler.overflows_at_min,
      state.scaler.overflow_steps_total,
      static_cast<int64_t>(state.fp8_scales.size()),
      static_cast<int64_t>(checksum(state.fp8_scales.data(), state.fp8_scales.size() * 4)),
      state.optimizer_steps,
      static_cast<int64_t>(checksum(host.data(), host.nbytes()))};
  // The host's words go over the host communicator where there is one (MPI beside NCCL).
  const std::vector<int64_t> all = comm.all_gather_host(record);

  // Every rank holds the same table, so every rank reaches the same verdict and message.
  std::ostringstream message;
  for (size_t f = 0; f < kNumFields; ++f) {
    std::vector<int> differ;
    const int64_t reference = all[f];
    for (int r = 1; r < n; ++r) {
      if (all[static_cast<size_t>(r) * kNumFields + f] != reference) differ.push_back(r);
    }
    if (differ.empty()) continue;
    const bool replica_field = f + 1 == kNumFields;
    message << "; " << (zero1 && replica_field ? kZero1ReplicaField : kFields[f].name)
            << ": rank 0 has ";
    const auto print = [&](int64_t v) {
      if (kFields[f].hex) {
        message << "0x" << std::hex << static_cast<uint64_t>(v) << std::dec;
      } else {
        message << v;
      }
    };
    print(reference);
    for (int r : differ) {
      message << ", rank " << r << " has ";
      print(all[static_cast<size_t>(r) * kNumFields + f]);
    }
  }
  // A fault of the machine (a flipped bit, a rank that computed differently), not of the input.
  MANTISSA_REQUIRE(message.str().empty(), kFailure,
                   "consistency check failed at step " << state.step << ": the replicas differ"
                                                       << message.str());
}

}  // namespace mantissa::dist
