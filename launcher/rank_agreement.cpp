#include "launcher/rank_agreement.h"

#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/read_file.h"
#include "core/strings.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"

namespace mantissa::launcher {
namespace {

// Each field as "<key>:<length>:<bytes>", so that any bytes (a path holding ':' or a newline)
// come through.
void put(std::string& out, const std::string& key, const std::string& value) {
  out += key + ':' + std::to_string(value.size()) + ':' + value;
}

std::map<std::string, std::string> fields_of(const std::string& bytes) {
  std::map<std::string, std::string> fields;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t key_end = bytes.find(':', at);
    if (key_end == std::string::npos) break;
    const size_t length_end = bytes.find(':', key_end + 1);
    if (length_end == std::string::npos) break;
    size_t length = 0;
    try {
      length = std::stoul(bytes.substr(key_end + 1, length_end - key_end - 1));
    } catch (const std::exception&) {
      break;
    }
    if (length > bytes.size() - length_end - 1) break;
    fields[bytes.substr(at, key_end - at)] = bytes.substr(length_end + 1, length);
    at = length_end + 1 + length;
  }
  return fields;
}

int64_t to_int64(const std::string& text) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return 0;
  }
}

uint64_t to_uint64(const std::string& text) {
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
}

// "rank 2 (host node2)", "ranks [2, 3] (hosts node2, node3)".
std::string who(const std::vector<int>& ranks, const std::vector<std::string>& hosts_by_rank) {
  const std::string hosts = dist::format_hosts(ranks, hosts_by_rank);
  const bool one_host = hosts.find(", ") == std::string::npos;
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]) + " (host " + hosts + ")";
  return "ranks " + dist::format_ranks(ranks) + (one_host ? " (host " : " (hosts ") + hosts + ")";
}

std::string who(const std::vector<int>& ranks, const std::vector<RankStart>& starts) {
  std::vector<std::string> hosts_by_rank;
  for (const RankStart& s : starts) hosts_by_rank.push_back(s.host);
  return who(ranks, hosts_by_rank);
}

// The ranks grouped by `key`, the groups in the order of their first rank, each described as
// "<who>: <what(first rank of the group)>", joined by "; ". Empty when every rank has rank 0's
// key.
template <class Key, class What>
std::string groups_when_split(const std::vector<RankStart>& starts, const Key& key,
                              const What& what) {
  std::vector<std::pair<decltype(key(starts[0])), std::vector<int>>> groups;
  for (size_t r = 0; r < starts.size(); ++r) {
    const auto k = key(starts[r]);
    auto group = groups.begin();
    while (group != groups.end() && !(group->first == k)) ++group;
    if (group == groups.end()) {
      groups.push_back({k, {}});
      group = groups.end() - 1;
    }
    group->second.push_back(static_cast<int>(r));
  }
  if (groups.size() == 1) return "";
  return core::join(groups, "; ", [&](const auto& group) {
    return who(group.second, starts) + ": " + what(starts[static_cast<size_t>(group.second[0])]);
  });
}

std::string describe_corpus(const CorpusIdentity& c) {
  char fingerprint[32];
  std::snprintf(fingerprint, sizeof fingerprint, "%016" PRIx64, c.fingerprint);
  return std::to_string(c.tokens) + " tokens (fingerprint " + fingerprint + ") from " + c.name;
}

void require_same_corpus(const std::vector<RankStart>& starts, const char* what,
                         CorpusIdentity RankStart::*corpus) {
  const std::string split = groups_when_split(
      starts, [&](const RankStart& s) { return s.*corpus; },
      [&](const RankStart& s) { return describe_corpus(s.*corpus); });
  if (!split.empty()) {
    throw RanksDisagree(std::string("the ranks read different ") + what + " tokens: " + split +
                        ". Every rank must read the same corpus (its files may lie at "
                        "other paths on each host, but must hold the same tokens)");
  }
}

// The ranks whose settings differ from rank 0's; the first one's differences named.
void require_same_settings(const std::vector<RankStart>& starts) {
  std::vector<int> differing;
  for (size_t r = 1; r < starts.size(); ++r) {
    if (starts[r].settings != starts[0].settings) differing.push_back(static_cast<int>(r));
  }
  if (differing.empty()) return;
  const int first = differing[0];
  std::string fields;
  try {
    const std::vector<std::string> changes =
        config_differences(parse_config_text(starts[0].settings, "rank 0's settings"),
                           parse_config_text(starts[static_cast<size_t>(first)].settings,
                                             "rank " + std::to_string(first) + "'s settings"));
    fields = core::join(changes, ", ");
  } catch (const core::ConfigError&) {
    // The same build writes and reads the text; nothing more to name if it does not parse.
  }
  throw RanksDisagree(
      "the settings of " + who(differing, starts) + " differ from those of " + who({0}, starts) +
      (fields.empty() ? std::string()
                      : " (rank 0's -> rank " + std::to_string(first) + "'s: " + fields + ")") +
      ". Every rank must run the same config and --set options; only the data's paths, "
      "data.tokenizer, model.init_from and the metrics section may differ between hosts");
}

// A GPU is its machine and its PCI address. The machine is the host name and the kernel's boot
// id, as NCCL tells hosts apart: identical servers have their GPUs at the same addresses, and
// containers on different servers may share a host name, but not a boot id.
void require_own_gpus(const std::vector<RankStart>& starts) {
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<int>> ranks_of_gpu;
  for (size_t r = 0; r < starts.size(); ++r) {
    const RankStart& s = starts[r];
    if (s.cuda && !s.pci_address.empty()) {
      ranks_of_gpu[{s.host, s.boot_id, s.pci_address}].push_back(static_cast<int>(r));
    }
  }
  for (const auto& [gpu, ranks] : ranks_of_gpu) {
    if (ranks.size() < 2) continue;
    throw RanksDisagree(
        who(ranks, starts) + " share one GPU, at PCI " + std::get<2>(gpu) + " (" +
        starts[static_cast<size_t>(ranks[0])].device +
        "): NCCL needs a GPU of its own for each rank. A rank takes its local rank modulo "
        "the GPUs it sees: start at most as many ranks on each host as it has GPUs (mpirun "
        "--npernode, srun --ntasks-per-node), or give each rank its own (srun "
        "--gpus-per-task=1)");
  }
}

}  // namespace

std::string kernel_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::string shared_settings_text(const TrainConfig& config) {
  TrainConfig shared = config;
  TrainConfig::Data& data = *shared.mutable_data();
  if (data.has_text_file()) data.mutable_text_file()->clear_path();
  if (data.has_token_shards()) {
    data.mutable_token_shards()->clear_pattern();
    data.mutable_token_shards()->clear_val_pattern();
  }
  data.clear_tokenizer();
  // Whether initial weights are read matters (rank 0's are broadcast: a rank 0 without them
  // would start every rank from random weights); where the file lies does not.
  if (!shared.model().init_from().empty()) shared.mutable_model()->set_init_from("<given>");
  shared.clear_metrics();
  return to_text(shared);
}

std::string encode_rank_start(const RankStart& start) {
  std::string out;
  put(out, "build", start.build);
  put(out, "cuda", start.cuda ? "1" : "0");
  put(out, "device", start.device);
  put(out, "pci_address", start.pci_address);
  put(out, "boot_id", start.boot_id);
  for (const auto& [prefix, corpus] :
       {std::pair{"train", &start.train}, std::pair{"validation", &start.validation}}) {
    put(out, std::string(prefix) + ".name", corpus->name);
    put(out, std::string(prefix) + ".tokens", std::to_string(corpus->tokens));
    put(out, std::string(prefix) + ".fingerprint", std::to_string(corpus->fingerprint));
  }
  put(out, "settings", start.settings);
  return out;
}

RankStart decode_rank_start(const std::string& bytes) {
  std::map<std::string, std::string> fields = fields_of(bytes);
  RankStart start;
  start.build = fields["build"];
  start.cuda = fields["cuda"] == "1";
  start.device = fields["device"];
  start.pci_address = fields["pci_address"];
  start.boot_id = fields["boot_id"];
  for (const auto& [prefix, corpus] :
       {std::pair{"train", &start.train}, std::pair{"validation", &start.validation}}) {
    corpus->name = fields[std::string(prefix) + ".name"];
    corpus->tokens = to_int64(fields[std::string(prefix) + ".tokens"]);
    corpus->fingerprint = to_uint64(fields[std::string(prefix) + ".fingerprint"]);
  }
  start.settings = fields["settings"];
  return start;
}

void require_agreement(const std::vector<RankStart>& starts) {
  if (starts.size() < 2) return;
  if (const std::string split = groups_when_split(
          starts, [](const RankStart& s) { return s.build; },
          [](const RankStart& s) { return s.build; });
      !split.empty()) {
    throw RanksDisagree("the ranks run different builds of mantissa: " + split +
                        ". Install the same build on every host");
  }
  require_same_settings(starts);
  if (const std::string split = groups_when_split(
          starts, [](const RankStart& s) { return s.cuda; },
          [](const RankStart& s) { return s.cuda ? "a GPU (" + s.device + ")" : "the CPU"; });
      !split.empty()) {
    throw RanksDisagree(
        "the ranks run on different kinds of device: " + split +
        ". run.device AUTO takes a GPU where a rank sees one: let every rank see a GPU "
        "(CUDA_VISIBLE_DEVICES, srun --gpus-per-task), or set run.device to CPU");
  }
  require_own_gpus(starts);
  require_same_corpus(starts, "training", &RankStart::train);
  require_same_corpus(starts, "validation", &RankStart::validation);
}

void require_ranks_agree(const dist::World& world, const RankStart& mine, double timeout_s) {
  if (world.size() == 1) return;
  const std::vector<std::string> gathered = world.all_gather(encode_rank_start(mine), timeout_s);
  std::vector<RankStart> starts;
  for (int r = 0; r < world.size(); ++r) {
    starts.push_back(decode_rank_start(gathered[static_cast<size_t>(r)]));
    starts.back().host = world.host_of(r);
  }
  require_agreement(starts);
}

void require_shared_run_dir(const dist::World& world, const std::string& run_dir,
                            double timeout_s) {
  if (world.size() == 1) return;
  constexpr std::string_view kPrefix = ".shared-";
  const std::filesystem::path dir = std::filesystem::absolute(run_dir);
  // Rank 0's file, removed however this ends (a file left by a rank 0 that was killed goes at
  // the next start: rank 0 holds run.dir's lock, so no other run is checking).
  struct RemoveAtExit {
    std::filesystem::path path;
    ~RemoveAtExit() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove(path, ignored);
    }
  } written;
  // A name no rank has looked up before, so that no cached "no such file" of a network file
  // system hides it; rank 0 sends the file's whole path, for the message.
  std::string rank0_file;
  if (world.rank() == 0) {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ignored)) {
      if (entry.path().filename().string().starts_with(kPrefix)) {
        std::filesystem::remove(entry.path(), ignored);
      }
    }
    std::random_device random;
    char name[48];
    std::snprintf(name, sizeof name, "%s%08x%08x-%ld", kPrefix.data(), random(), random(),
                  static_cast<long>(::getpid()));
    written.path = dir / name;
    core::write_file_atomically(written.path.string(), name);
    rank0_file = written.path.string();
  }
  rank0_file = world.all_gather(rank0_file, timeout_s)[0];
  const std::string name = std::filesystem::path(rank0_file).filename().string();
  std::string unseen;  // why this rank does not read what rank 0 wrote; "" when it does
  if (world.rank() != 0) {
    // A network file system may have cached that run.dir did not exist a moment ago: a few
    // more tries, each after opening run.dir's parent, which makes the client look again.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      try {
        unseen = core::read_whole_file((dir / name).string(), "rank 0's file") == name
                     ? ""
                     : "'" + (dir / name).string() + "' holds other bytes";
      } catch (const core::Error& e) {
        unseen = e.what();
      }
      if (unseen.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::error_code ignored;
      std::filesystem::directory_iterator(dir.parent_path(), ignored);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  const std::vector<std::string> unseen_by_rank = world.all_gather(unseen, timeout_s);
  std::vector<int> blind;
  for (int r = 0; r < world.size(); ++r) {
    if (!unseen_by_rank[static_cast<size_t>(r)].empty()) blind.push_back(r);
  }
  if (blind.empty()) return;
  throw RanksDisagree("run.dir = \"" + run_dir +
                      "\" is not one directory shared by every rank: " + who(blind, world.hosts()) +
                      " cannot read the file " + who({0}, world.hosts()) + " wrote there, " +
                      rank0_file + " (rank " + std::to_string(blind[0]) + ": " +
                      unseen_by_rank[static_cast<size_t>(blind[0])] +
                      "). Every rank writes its part of each checkpoint into run.dir: put it on a "
                      "file system that every host mounts" +
                      (std::filesystem::path(run_dir).is_relative()
                           ? " (a relative run.dir is taken from each rank's working directory)"
                           : ""));
}

}  // namespace mantissa::launcher
