// `mantissa plan`: what a config's run needs and how fast it goes on a cluster of N devices,
// projected by the analytic model of plan_model.h, before anything is launched.
#pragma once

#include <string>
#include <vector>

#include "config.pb.h"

namespace mantissa::launcher {

extern const char* const kPlanHelp;

struct PlanArgs {
  bool help = false;
  std::string config_path;
  std::vector<std::string> sets;
  int gpus = 0;
  std::string gpu = "h100";
  int per_node = 0;        // 0: the device's node size
  double link_gbps = 0;    // 0: the device's network
  double node_gbps = 0;    // 0: the device's link within its node
  double tflops = 0;       // 0: the device's peaks
  double efficiency = 0;   // 0: the device's default
  double memory_gbps = 0;  // 0: the device's
  int cores = 0;
};

// Throws core::ConfigError naming the option for a malformed command line.
PlanArgs parse_plan_args(const std::vector<std::string>& args);

// The report: the model, the cluster, memory per device by precision and ZeRO stage, the
// step's time, and one "projection: key=value ..." line for scripts. Throws
// core::ConfigError for a config or cluster it cannot project.
std::string plan_report(const PlanArgs& args);

}  // namespace mantissa::launcher
