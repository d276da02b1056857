// The cross-rank consistency check: do the replicas of a data-parallel job still agree?
//
// Every rank contributes one fixed record (step, loss-scaler state, FP8 scales, optimizer
// steps, a checksum of its copy of the weights), the records are all-gathered, and every rank
// compares the same table, so all reach the same verdict and throw the same message, naming
// each field that differs and the ranks whose value differs from rank 0's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/precision/loss_scaler.h"
#include "dist/step_comm.h"
#include "train/parameters.h"

namespace mantissa::dist {

// What the consistency check compares across ranks.
struct ReplicaState {
  int64_t step = 0;
  core::LossScalerState scaler;
  std::vector<float> fp8_scales;
  int64_t optimizer_steps = 0;
};

// Throws core::Error ("consistency check failed at step S: the replicas differ; <field>: rank
// 0 (host a) has X, rank R (host b) has Y...") when any field differs; the hosts where
// hosts_by_rank names them (empty: ranks alone). The ranks agreed on their build, settings and
// tokens at the start (launcher/rank_agreement.h), so a difference points at a machine: the
// hosts are what an operator takes out. Collective, on the control communicator.
// The weights compared are the FP32 masters, or under ZeRO-1 (`zero1`), where each rank keeps a
// different shard of the masters, the compute copy ("checksum of the compute copy"), which is
// all-gathered from those shards and is the only whole copy of the weights.
void check_consistency(StepComm& comm, core::Backend& backend, train::ParameterStore& params,
                       bool zero1, const ReplicaState& state,
                       const std::vector<std::string>& hosts_by_rank);

}  // namespace mantissa::dist
