#include "dist/consistency_check.h"

#include <cstring>
#include <sstream>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/ops/math/checksum.h"

namespace mantissa::dist {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

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
                       bool zero1, const ReplicaState& state,
                       const std::vector<std::string>& hosts_by_rank) {
  const int n = comm.size();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &state.scaler.scale, sizeof scale_bits);
  // The weights are summed where they live (on a GPU, 8 bytes cross to the host, not the
  // whole buffer).
  const Tensor& replicated = zero1 ? params.compute() : params.masters();
  Tensor sum = Tensor::empty(Shape{1}, DType::kI64, backend.device());
  backend.checksum(replicated, sum);
  int64_t replica_checksum = 0;
  Tensor host_sum = Tensor::wrap(&replica_checksum, Shape{1}, DType::kI64);
  backend.copy(sum, host_sum);
  backend.synchronize();
  std::vector<int64_t> record = {state.step,
                                 scale_bits,
                                 state.scaler.growth_tracker,
                                 state.scaler.hysteresis_tracker,
                                 state.scaler.overflows_at_min,
                                 state.scaler.overflow_steps_total,
                                 static_cast<int64_t>(state.fp8_scales.size()),
                                 static_cast<int64_t>(core::checksum_bytes(
                                     state.fp8_scales.data(), state.fp8_scales.size() * 4)),
                                 state.optimizer_steps,
                                 replica_checksum};
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
    const auto rank_text = [&](int r) {
      message << "rank " << r;
      if (static_cast<size_t>(r) < hosts_by_rank.size()) {
        message << " (host " << hosts_by_rank[static_cast<size_t>(r)] << ")";
      }
      message << " has ";
    };
    message << "; " << (zero1 && replica_field ? kZero1ReplicaField : kFields[f].name) << ": ";
    rank_text(0);
    const auto print = [&](int64_t v) {
      if (kFields[f].hex) {
        message << "0x" << std::hex << static_cast<uint64_t>(v) << std::dec;
      } else {
        message << v;
      }
    };
    print(reference);
    for (int r : differ) {
      message << ", ";
      rank_text(r);
      print(all[static_cast<size_t>(r) * kNumFields + f]);
    }
  }
  // A fault of the machine (a flipped bit, a rank that computed differently), not of the input.
  MANTISSA_REQUIRE(message.str().empty(), kFailure,
                   "consistency check failed at step " << state.step << ": the replicas differ"
                                                       << message.str());
}

}  // namespace mantissa::dist
