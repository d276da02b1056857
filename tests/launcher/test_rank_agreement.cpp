// The start-up comparison of the ranks (launcher/rank_agreement.h): the description each rank
// sends, and the message every rank stops with when they differ, for each thing they must
// share. The gathering itself runs under mpirun in test_train.py.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "launcher/config/config.h"
#include "launcher/rank_agreement.h"

namespace mantissa::launcher {
namespace {

std::string error_of(const std::vector<RankStart>& ranks) {
  try {
    require_agreement(ranks);
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "";
}

TrainConfig defaulted(const std::vector<std::string>& sets) {
  TrainConfig c;
  for (const std::string& s : sets) apply_override(c, s);
  apply_defaults(c, "configs/unit.pbtxt");
  return c;
}

RankStart cpu_rank(const std::string& host) {
  RankStart s;
  s.host = host;
  s.build = "mantissa 0.2.0 (commit 0af4188c1a2b)";
  s.device = "CPU (2 threads)";
  s.train = {"/data/train_*.bin", 1000000, 0x1234};
  s.validation = {"/data/val_*.bin", 5000, 0x77};
  s.settings = shared_settings_text(defaulted({}));
  return s;
}

RankStart gpu_rank(const std::string& host, int index) {
  RankStart s = cpu_rank(host);
  s.boot_id = "boot of " + host;
  s.cuda = true;
  s.device = "NVIDIA H100 80GB HBM3 on cuda:" + std::to_string(index);
  s.pci_address = "0000:" + std::to_string(10 + index) + ":00.0";
  return s;
}

TEST(RankStart, EncodesAndDecodesAnyBytes) {
  RankStart s = gpu_rank("node1", 3);
  s.train.name = "/data/a:b:7:c\nd.txt";
  s.train.fingerprint = 0xFFFFFFFFFFFFFFFFull;
  s.validation = {};
  const RankStart back = decode_rank_start(encode_rank_start(s));
  EXPECT_EQ(back.host, "") << "the host is World's, not sent";
  EXPECT_EQ(back.build, s.build);
  EXPECT_TRUE(back.cuda);
  EXPECT_EQ(back.device, s.device);
  EXPECT_EQ(back.pci_address, s.pci_address);
  EXPECT_EQ(back.boot_id, s.boot_id);
  EXPECT_EQ(back.train.name, s.train.name);
  EXPECT_EQ(back.train.tokens, s.train.tokens);
  EXPECT_EQ(back.train.fingerprint, s.train.fingerprint);
  EXPECT_EQ(back.validation.tokens, 0);
  EXPECT_EQ(back.settings, s.settings);
}

TEST(RankStart, BytesCutShortKeepTheFieldsBefore) {
  const std::string bytes = encode_rank_start(gpu_rank("node1", 0));
  const RankStart cut = decode_rank_start(bytes.substr(0, bytes.find("device:") + 9));
  EXPECT_EQ(cut.build, "mantissa 0.2.0 (commit 0af4188c1a2b)");
  EXPECT_TRUE(cut.cuda);
  EXPECT_EQ(cut.device, "");
  EXPECT_EQ(cut.settings, "");
  EXPECT_EQ(decode_rank_start("build:999:x").build, "");
  EXPECT_EQ(decode_rank_start("build:-1:x").build, "");
}

TEST(RankAgreement, RanksThatShareEverythingPass) {
  EXPECT_EQ(error_of({cpu_rank("a"), cpu_rank("a"), cpu_rank("b"), cpu_rank("b")}), "");
  EXPECT_EQ(error_of({gpu_rank("a", 0), gpu_rank("a", 1), gpu_rank("b", 0), gpu_rank("b", 1)}), "")
      << "the same PCI address on two hosts is two GPUs";
  EXPECT_EQ(error_of({cpu_rank("a")}), "");
}

TEST(RankAgreement, OtherBuildsAreNamed) {
  std::vector<RankStart> ranks = {cpu_rank("a"), cpu_rank("a"), cpu_rank("b"), cpu_rank("c")};
  ranks[2].build = ranks[3].build = "mantissa 0.2.0 (commit 99999999aaaa)";
  EXPECT_EQ(error_of(ranks),
            "the ranks run different builds of mantissa: ranks [0, 1] (host a): mantissa 0.2.0 "
            "(commit 0af4188c1a2b); ranks [2, 3] (hosts b, c): mantissa 0.2.0 (commit "
            "99999999aaaa). Install the same build on every host");
}

TEST(RankAgreement, SettingsComeBeforeTheDevice) {
  // A rank on the CPU because its config says so is told the field, not to find it a GPU.
  std::vector<RankStart> ranks = {gpu_rank("a", 0), cpu_rank("b")};
  ranks[1].settings = shared_settings_text(defaulted({"run.device=CPU"}));
  const std::string e = error_of(ranks);
  EXPECT_NE(e.find("run.device AUTO -> CPU"), std::string::npos) << e;
}

TEST(RankAgreement, RanksOnTheCpuBesideRanksOnGpusAreNamed) {
  const std::string e = error_of({gpu_rank("a", 0), gpu_rank("a", 1), cpu_rank("b")});
  EXPECT_EQ(e,
            "the ranks run on different kinds of device: ranks [0, 1] (host a): a GPU (NVIDIA "
            "H100 80GB HBM3 on cuda:0); rank 2 (host b): the CPU. run.device AUTO takes a GPU "
            "where a rank sees one: let every rank see a GPU (CUDA_VISIBLE_DEVICES, srun "
            "--gpus-per-task), or set run.device to CPU");
}

TEST(RankAgreement, TwoRanksOnOneGpuAreNamed) {
  std::vector<RankStart> ranks = {gpu_rank("a", 0), gpu_rank("a", 1), gpu_rank("a", 0),
                                  gpu_rank("b", 0)};
  const std::string e = error_of(ranks);
  EXPECT_NE(e.find("ranks [0, 2] (host a) share one GPU, at PCI 0000:10:00.0 (NVIDIA H100 80GB "
                   "HBM3 on cuda:0): NCCL needs a GPU of its own for each rank"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("mpirun --npernode"), std::string::npos) << e;
  for (RankStart& r : ranks) r.pci_address = "";
  EXPECT_EQ(error_of(ranks), "") << "GPUs whose address is unknown are not compared";
}

TEST(RankAgreement, ServersThatShareAHostNameAreToldApartByBootId) {
  // Containers named alike on identical servers: the same host name and PCI addresses.
  std::vector<RankStart> ranks = {gpu_rank("trainer", 0), gpu_rank("trainer", 0)};
  ranks[0].boot_id = "b4d73d84-6d89-4b3d-a69c-f40554a9e9ef";
  ranks[1].boot_id = "0e0c5b8a-58a4-4f7e-9d0d-2c3ad1f1a6b2";
  EXPECT_EQ(error_of(ranks), "");
  ranks[1].boot_id = ranks[0].boot_id;
  EXPECT_NE(error_of(ranks).find("share one GPU"), std::string::npos);
}

TEST(RankAgreement, TheBootIdIsThisMachines) {
  const std::string id = kernel_boot_id();
  EXPECT_EQ(id.size(), 36u) << id;
  EXPECT_EQ(id, kernel_boot_id());
}

TEST(RankAgreement, OtherSettingsAreNamedFieldByField) {
  std::vector<RankStart> ranks = {cpu_rank("a"), cpu_rank("a"), cpu_rank("b")};
  ranks[2].settings = shared_settings_text(defaulted({"optimizer.adamw.lr=0.003", "run.steps=7"}));
  const std::string e = error_of(ranks);
  EXPECT_NE(e.find("the settings of rank 2 (host b) differ from those of rank 0 (host a) (rank "
                   "0's -> rank 2's: run.steps "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("-> 7"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.adamw.lr 0.0006 -> 0.003"), std::string::npos) << e;
}

TEST(RankAgreement, PathsAndMetricsMayDifferBetweenHosts) {
  const TrainConfig here =
      defaulted({"data.token_shards.pattern=/nvme/t_*.bin", "data.tokenizer=/nvme/t.model",
                 "model.init_from=/nvme/gpt2.bin", "metrics.bind_address=10.0.0.1"});
  const TrainConfig there =
      defaulted({"data.token_shards.pattern=/scratch/t_*.bin", "data.tokenizer=/scratch/t.model",
                 "model.init_from=/scratch/gpt2.bin", "metrics.bind_address=10.0.0.2"});
  EXPECT_EQ(shared_settings_text(here), shared_settings_text(there));
  EXPECT_NE(shared_settings_text(here),
            shared_settings_text(
                defaulted({"data.token_shards.pattern=/nvme/t_*.bin",
                           "data.tokenizer=/nvme/t.model", "metrics.bind_address=10.0.0.1"})))
      << "whether initial weights are read matters: rank 0's are broadcast";
  EXPECT_NE(shared_settings_text(defaulted({})),
            shared_settings_text(defaulted({"run.dir=elsewhere"})))
      << "every rank writes its part of a checkpoint to run.dir";
}

TEST(RankAgreement, OtherTrainingOrValidationTokensAreNamed) {
  std::vector<RankStart> ranks = {cpu_rank("a"), cpu_rank("b")};
  ranks[1].train.fingerprint = 0xABCD;
  EXPECT_EQ(error_of(ranks),
            "the ranks read different training tokens: rank 0 (host a): 1000000 tokens "
            "(fingerprint 0000000000001234) from /data/train_*.bin; rank 1 (host b): 1000000 "
            "tokens (fingerprint 000000000000abcd) from /data/train_*.bin. Every rank must read "
            "the same "
            "corpus (its files may lie at other paths on each host, but must hold the same "
            "tokens)");
  ranks[1].train = ranks[0].train;
  ranks[1].validation.tokens = 4000;
  const std::string e = error_of(ranks);
  EXPECT_NE(e.find("the ranks read different validation tokens: rank 0 (host a): 5000 tokens"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("rank 1 (host b): 4000 tokens"), std::string::npos) << e;
}

}  // namespace
}  // namespace mantissa::launcher
