// What the ranks of one job must share, compared once at start-up, before the communicators
// are built: one build of mantissa, one kind of device, a GPU of its own for each GPU rank, the
// same settings, the same tokens, and one run directory. Each rank describes itself (RankStart),
// the descriptions are all-gathered, and every rank runs the same comparison, so all of them stop
// with the same message (a config error, exit 2) naming the ranks, their hosts and what differs.
//
// Without it such a job goes wrong later, and says less:
//  - ranks on different devices (run.device AUTO where some ranks see no GPU) build NCCL on
//    some and MPI on others, whose collectives never match: a hang, then a timeout;
//  - NCCL refuses two ranks on one GPU, but only after the model and the data are built;
//  - other settings (a stale copy of the config on one host) let the replicas drift apart
//    until the next consistency check;
//  - other tokens (a stale copy of the shards on one host) are trained on silently: the
//    gradients are averaged, the replicas stay identical, and nothing finds it.
//
// What may differ between hosts: where the data, the tokenizer and model.init_from lie (the
// tokens are compared by their count and Corpus::fingerprint, a sample of them; rank 0 reads
// the tokenizer; whether model.init_from is given is compared, and rank 0's initial weights are
// broadcast), and the metrics section (how each host exports).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.pb.h"
#include "core/error.h"
#include "dist/world.h"

namespace mantissa::launcher {

// A corpus as the ranks compare it (train::Corpus's name, num_tokens and fingerprint).
struct CorpusIdentity {
  std::string name;  // what was configured, for messages
  int64_t tokens = 0;
  uint64_t fingerprint = 0;

  // The same tokens, wherever they lie: the name is a path, which may differ between hosts.
  bool operator==(const CorpusIdentity& other) const {
    return tokens == other.tokens && fingerprint == other.fingerprint;
  }
};

// What require_agreement throws: a config error found alike on every rank, so the job can end
// without MPI_Abort (every rank returns, having cleaned up what its start made).
class RanksDisagree : public core::ConfigError {
 public:
  using core::ConfigError::ConfigError;
};

// One rank's description of itself.
struct RankStart {
  std::string host;   // filled in from dist::World, which knows every rank's
  std::string build;  // build_name()
  bool cuda = false;
  std::string device;       // DeviceInfo::name, "on cuda:<index>" added for a GPU
  std::string pci_address;  // DeviceInfo::pci_address ("" on the CPU)
  std::string boot_id;      // kernel_boot_id(): with the host, which machine the GPU is in
  CorpusIdentity train;
  CorpusIdentity validation;  // tokens 0 when the run evaluates nothing
  std::string settings;       // shared_settings_text(config)
};

// This machine's /proc/sys/kernel/random/boot_id ("" where unreadable): the same in every
// container on it, another on each machine and after each boot.
std::string kernel_boot_id();

// The config as text, less what may differ between hosts (above).
std::string shared_settings_text(const TrainConfig& config);

// A RankStart as bytes and back (its host excepted). A field the bytes lack keeps its default,
// so a description from another build still decodes; the builds are compared first.
std::string encode_rank_start(const RankStart& start);
RankStart decode_rank_start(const std::string& bytes);

// Throws RanksDisagree at the first thing the ranks (by rank) do not share: build, settings
// (naming the fields, rank 0's value -> the other rank's; run.device among them), kind of device,
// GPU, training tokens, validation tokens.
void require_agreement(const std::vector<RankStart>& ranks);

// Throws RanksDisagree on every rank when some rank cannot read a file rank 0 wrote into
// run_dir (removed again): a run.dir on each host's own disk, which training would fill happily
// until its first checkpoint, where the other ranks' parts cannot join rank 0's. Collective, as
// require_ranks_agree; rank 0 must have made run_dir (the others need not: where it is shared,
// it is there).
void require_shared_run_dir(const dist::World& world, const std::string& run_dir, double timeout_s);

// Gathers every rank's `mine` and calls require_agreement on every rank. Collective (a rank that
// does not join within timeout_s ends the job, as World::abort_on_timeout does); returns at once
// in a job of one rank.
void require_ranks_agree(const dist::World& world, const RankStart& mine, double timeout_s);

}  // namespace mantissa::launcher
