// Checkpoints: CRC32C, the sealed manifest, save/load round trips (bit-identical), atomic
// publication and pruning, damage detection with fallback (1000 random byte flips), and
// multi-rank saves and loads on another number of ranks (ranks simulated by threads sharing
// one barrier).
#include <gtest/gtest.h>
#include <sys/fsuid.h>
#include <unistd.h>

#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_manifest.h"
#include "checkpoint/crc32c.h"
#include "tests/common/scratch_dir.h"

namespace fs = std::filesystem;
using namespace mantissa;
using checkpoint::BufferSlice;
using checkpoint::Checkpointer;
using checkpoint::CheckpointState;
using checkpoint::crc32c;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Deterministic values for buffer `name` at step `step`: element i of a buffer is the same
// whichever rank holds it, so a reassembled buffer can be compared with a fresh one.
std::vector<float> values(const std::string& name, int64_t step, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(static_cast<uint32_t>(checkpoint::crc32c(name.data(), name.size()) + step));
  std::normal_distribution<float> normal;
  for (float& x : v) x = normal(rng);
  return v;
}

// A state with every field set to something other than its default.
checkpoint::CheckpointState make_state(int64_t step) {
  checkpoint::CheckpointState s;
  s.step = step;
  s.tokens = step * 4096;
  s.optimizer_steps = step - 1;
  s.seed = 0xDEADBEEFCAFEull;
  s.zero_stage = 1;
  s.loss_scaler = {.scale = 32768.0f,
                   .growth_tracker = 17,
                   .hysteresis_tracker = 1,
                   .overflows_at_min = 2,
                   .overflow_steps_total = 5,
                   .dynamic = true};
  core::Fp8TensorState fp8;
  fp8.name = "h.0.attn.c_attn.input";
  fp8.format = core::DType::kE4M3;
  fp8.amax_history = {1.5f, 0.25f, 3.0f, 0.0f};
  fp8.history_next = 3;
  fp8.scale = 149.33f;
  fp8.scale_inv = 1.0f / 149.33f;
  s.fp8.tensors = {fp8};
  fp8.name = "h.0.attn.c_attn.grad_output";
  fp8.format = core::DType::kE5M2;
  s.fp8.tensors.push_back(fp8);
  s.data.next_window = step * 8;
  s.data_fingerprint = 0xF00DCAFE12345678ULL + static_cast<uint64_t>(step);
  s.tokenizer_crc32c = 0xC0FFEE00u + static_cast<uint32_t>(step);
  s.config_text = "run { steps: 100 }\nmodel { gpt2 { n_layer: 2 } }\n";
  s.last_val_loss = 3.25 + static_cast<double>(step);
  s.val_loss_rises = 2;
  s.validation_key = 0xBADC0FFEE0DDF00DULL + static_cast<uint64_t>(step);
  s.parameters = {{"wte", core::Shape{10, 4}, 0}, {"h.0.ln_1.weight", core::Shape{4}, 128}};
  return s;
}

constexpr int64_t kN = 300;  // elements per flat buffer (the layout above fits)
const char* const kBuffers[] = {"masters", "adam_m", "adam_v"};

// Host storage for one rank's slices of every buffer.
struct Slices {
  std::vector<std::vector<float>> data;
  std::vector<checkpoint::BufferSlice> slices;

  Slices(int64_t begin, int64_t end, int64_t step) {
    for (const char* name : kBuffers) {
      const std::vector<float> all = values(name, step, kN);
      data.emplace_back(all.begin() + begin, all.begin() + end);
    }
    for (size_t i = 0; i < data.size(); ++i)
      slices.push_back(
          {kBuffers[i], kN, begin,
           core::Tensor::wrap(data[i].data(), core::Shape{end - begin}, core::DType::kF32)});
  }
  // Zeroed storage to load into.
  static Slices empty(int64_t begin, int64_t end) {
    Slices s(begin, end, 0);
    for (auto& d : s.data) std::fill(d.begin(), d.end(), 0.0f);
    return s;
  }
  // Whether buffer i's held elements equal those of `step`, bit for bit.
  bool buffer_equals_step(size_t i, int64_t step) const {
    const std::vector<float> all = values(kBuffers[i], step, kN);
    return std::memcmp(data[i].data(), all.data() + slices[i].begin, data[i].size() * 4) == 0;
  }
  bool equals_step(int64_t step) const {
    for (size_t i = 0; i < data.size(); ++i)
      if (!buffer_equals_step(i, step)) return false;
    return true;
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  tests::ScratchDir tmp{"mantissa_ckpt"};
  std::string dir() const { return tmp.path() + "/ckpt"; }
  checkpoint::CheckpointOptions options(int keep = 3) const {
    // Small entries, so that buffers are split into several pieces with their own CRCs.
    return {.dir = dir(), .keep = keep, .max_entry_bytes = 256};
  }
  void save(int64_t step, int keep = 3) {
    checkpoint::Checkpointer ckpt(options(keep), {}, *backend);
    Slices s(0, kN, step);
    ckpt.save(make_state(step), s.slices);
  }
  std::optional<checkpoint::CheckpointState> load(Slices& into) {
    checkpoint::Checkpointer ckpt(options(), {}, *backend);
    return ckpt.load_latest(make_state(0).parameters, into.slices);
  }
  // The step `ckpt` loads (-1: none), and a save of `step` by it afterwards: one object, as in
  // a run, with the warnings about damage kept off the test's output.
  int64_t load_quietly(checkpoint::Checkpointer& ckpt) {
    Slices into = Slices::empty(0, kN);
    testing::internal::CaptureStderr();
    const auto state = ckpt.load_latest(make_state(0).parameters, into.slices);
    testing::internal::GetCapturedStderr();
    return state ? state->step : -1;
  }
  void save_quietly(checkpoint::Checkpointer& ckpt, int64_t step) {
    Slices s(0, kN, step);
    testing::internal::CaptureStderr();
    ckpt.save(make_state(step), s.slices);
    testing::internal::GetCapturedStderr();
  }
};

}  // namespace

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  EXPECT_EQ(checkpoint::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(checkpoint::crc32c("", 0), 0u);
  std::vector<unsigned char> bytes(32, 0x00);
  EXPECT_EQ(checkpoint::crc32c(bytes.data(), 32), 0x8A9136AAu);
  std::fill(bytes.begin(), bytes.end(), 0xFF);
  EXPECT_EQ(checkpoint::crc32c(bytes.data(), 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(checkpoint::crc32c(bytes.data(), 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(checkpoint::crc32c(bytes.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, MatchesBitwiseDefinitionAtEveryLengthAndSplit) {
  // Both ways of computing it (crc32c: the crc32 instruction where the CPU has SSE4.2, as
  // every CPU that runs the tests does; crc32c_table: the slicing-by-8 loop) against the
  // one-bit-at-a-time definition, over lengths and alignments that exercise the 8-byte and the
  // byte loops, and continuation across any split point.
  std::mt19937 rng(7);
  std::vector<unsigned char> data(200);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= data.size(); n += 13) {
      uint32_t crc = ~0u;
      for (size_t i = 0; i < n; ++i) {
        crc ^= data[offset + i];
        for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
      }
      const uint32_t expected = ~crc;
      ASSERT_EQ(checkpoint::crc32c(data.data() + offset, n), expected)
          << "offset " << offset << " n " << n;
      ASSERT_EQ(checkpoint::crc32c_table(data.data() + offset, n), expected)
          << "offset " << offset << " n " << n;
      const size_t split = n / 3;
      ASSERT_EQ(checkpoint::crc32c(data.data() + offset + split, n - split,
                                   checkpoint::crc32c(data.data() + offset, split)),
                expected);
      ASSERT_EQ(checkpoint::crc32c_table(data.data() + offset + split, n - split,
                                         checkpoint::crc32c_table(data.data() + offset, split)),
                expected);
    }
  }
}

TEST(SealedMessage, EveryFlippedByteIsDetected) {
  const std::string sealed = checkpoint::seal_message(checkpoint::state_to_proto(make_state(42)));
  mantissa::TrainState parsed;
  checkpoint::unseal_message(sealed, parsed, "m");
  EXPECT_EQ(parsed.step(), 42);
  for (size_t i = 0; i < sealed.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = sealed;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_THROW(checkpoint::unseal_message(bad, parsed, "m"), checkpoint::CheckpointDamaged);
    }
  }
  EXPECT_THROW(checkpoint::unseal_message(sealed.substr(0, sealed.size() - 1), parsed, "m"),
               checkpoint::CheckpointDamaged);
  EXPECT_THROW(checkpoint::unseal_message("", parsed, "m"), checkpoint::CheckpointDamaged);
}

TEST_F(CheckpointTest, NoCheckpointLoadsNothing) {
  Slices into = Slices::empty(0, kN);
  checkpoint::Checkpointer ckpt(options(), {}, *backend);
  EXPECT_TRUE(ckpt.steps().empty());
  EXPECT_FALSE(ckpt.load_latest(make_state(0).parameters, into.slices).has_value());
}

TEST_F(CheckpointTest, RoundTripIsBitIdentical) {
  save(7);
  Slices into = Slices::empty(0, kN);
  const std::optional<checkpoint::CheckpointState> loaded = load(into);
  ASSERT_TRUE(loaded.has_value());
  checkpoint::CheckpointState expected = make_state(7);
  expected.world_size = 1;
  EXPECT_EQ(*loaded, expected);  // scaler, FP8 histories and scales, cursor, config, layout
  EXPECT_TRUE(into.equals_step(7));

  // The layout on disk: the directory, its manifest and payload, and `latest`.
  EXPECT_EQ(read_file(dir() + "/latest"), "step_00000007\n");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir() + "/step_00000007"))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"manifest.pb", "rank_00000.bin"}));
  // 3 buffers of 1200 bytes in 256-byte entries: 5 entries each.
  mantissa::TrainState manifest;
  checkpoint::unseal_message(read_file(dir() + "/step_00000007/manifest.pb"), manifest, "m");
  EXPECT_EQ(manifest.tensors_size(), 15);
  EXPECT_EQ(fs::file_size(dir() + "/step_00000007/rank_00000.bin"), 3u * kN * 4);
}

TEST_F(CheckpointTest, KeepsTheNewestAndReplacesNewerOnes) {
  for (int64_t step : {10, 20, 30, 40}) save(step, /*keep=*/2);
  EXPECT_FALSE(fs::exists(dir() + "/step_00000010"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000020"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000020.removed.tmp"));
  EXPECT_TRUE(fs::exists(dir() + "/step_00000030"));
  EXPECT_TRUE(fs::exists(dir() + "/step_00000040"));
  // A run resumed from step 30 saves step 35: step 40 belongs to the abandoned run.
  save(35, 2);
  EXPECT_FALSE(fs::exists(dir() + "/step_00000040"));
  EXPECT_EQ(read_file(dir() + "/latest"), "step_00000035\n");
  Slices into = Slices::empty(0, kN);
  EXPECT_EQ(load(into)->step, 35);
  // Saving the same step again replaces it, saying so.
  testing::internal::CaptureStderr();
  save(35, 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(
      err.find("replacing checkpoint " + dir() + "/step_00000035, left by an earlier attempt"),
      std::string::npos)
      << err;
  EXPECT_EQ(load(into)->step, 35);
  EXPECT_TRUE(into.equals_step(35));
}

TEST_F(CheckpointTest, IncompleteSavesAreIgnoredAndCleanedUp) {
  save(10);
  // A save that crashed before its rename leaves step_<N>.tmp; one that crashed before the
  // manifest was written cannot be published, but a directory without a manifest is also
  // handled (damaged).
  fs::create_directories(dir() + "/step_00000020.tmp");
  write_file(dir() + "/step_00000020.tmp/rank_00000.bin", "partial");
  // A removal (checkpoint.keep) that crashed part way leaves step_<N>.removed.tmp.
  fs::create_directories(dir() + "/step_00000005.removed.tmp");
  fs::create_directories(dir() + "/step_00000030");
  // One that crashed while it replaced `latest` leaves its temporary (latest.<pid>-<n>.tmp).
  write_file(dir() + "/latest.4242-0.tmp", "step_00000020\n");
  Slices into = Slices::empty(0, kN);
  testing::internal::CaptureStderr();
  EXPECT_EQ(load(into)->step, 10);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("step_00000030/manifest.pb: cannot open"), std::string::npos) << err;
  EXPECT_TRUE(into.equals_step(10));
  save(15);
  EXPECT_FALSE(fs::exists(dir() + "/step_00000020.tmp"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000005.removed.tmp"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000030"));
  EXPECT_FALSE(fs::exists(dir() + "/latest.4242-0.tmp"));
}

// Only the names saves give count: step_000000012 (a copy named by hand) is no checkpoint of
// step 12, which would be read from step_00000012; longer numbers without a leading 0 are.
TEST(CheckpointListing, OnlyTheNamesSavesGiveAreCheckpoints) {
  const tests::ScratchDir dir("mantissa_ckpt_listing");
  for (const char* name : {"step_00000007", "step_000000012", "step_123456789", "step_0000001",
                           "step_00000009.tmp", "latest"}) {
    fs::create_directories(dir.file(name));
  }
  EXPECT_EQ(checkpoint::list_checkpoints(dir.path()), (std::vector<int64_t>{123456789, 7}));
}

TEST_F(CheckpointTest, TruncatedPayloadFallsBackWithAMessage) {
  save(10);
  save(20);
  const std::string payload = dir() + "/step_00000020/rank_00000.bin";
  fs::resize_file(payload, fs::file_size(payload) - 1);
  Slices into = Slices::empty(0, kN);
  testing::internal::CaptureStderr();
  EXPECT_EQ(load(into)->step, 10);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(payload + ": 3599 bytes, the index says 3600"), std::string::npos) << err;
  EXPECT_NE(err.find("falling back to step_00000010"), std::string::npos) << err;
  EXPECT_TRUE(into.equals_step(10));
}

// A checkpoint copied by hand under a newer step's name (a backup put back): the manifest
// says step 10, so it is damaged as step 30, not loaded as step 10 with the save after it
// rolling back over step 20 and removing step 30.
TEST_F(CheckpointTest, ACheckpointUnderAnotherStepsNameIsDamaged) {
  save(10, 0);
  save(20, 0);
  fs::copy(dir() + "/step_00000010", dir() + "/step_00000030");
  Slices into = Slices::empty(0, kN);
  testing::internal::CaptureStderr();
  EXPECT_EQ(load(into)->step, 20);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(dir() + "/step_00000030/manifest.pb: the manifest is of step 10, its "
                             "directory's name of step 30"),
            std::string::npos)
      << err;
  EXPECT_TRUE(into.equals_step(20));
}

// checkpoint.keep 2, step 5 damaged: the run resumes from step 4 and saves step 6. Counting
// step 5 would remove step 4, and a step 6 damaged in turn would leave nothing to resume from.
TEST_F(CheckpointTest, ADamagedCheckpointTakesNoIntactOnesPlace) {
  save(4, 2);
  save(5, 2);
  const std::string payload = dir() + "/step_00000005/rank_00000.bin";
  fs::resize_file(payload, fs::file_size(payload) - 1);
  checkpoint::Checkpointer ckpt(options(2), {}, *backend);
  EXPECT_EQ(load_quietly(ckpt), 4);
  save_quietly(ckpt, 6);
  EXPECT_TRUE(fs::exists(dir() + "/step_00000004"));
  EXPECT_TRUE(fs::exists(dir() + "/step_00000005")) << "kept while an older intact one is";
  EXPECT_TRUE(fs::exists(dir() + "/step_00000006"));
  // Two intact checkpoints newer than it: it goes with step 4.
  save_quietly(ckpt, 8);
  EXPECT_FALSE(fs::exists(dir() + "/step_00000004"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000005"));
  EXPECT_TRUE(fs::exists(dir() + "/step_00000006"));
  EXPECT_TRUE(fs::exists(dir() + "/step_00000008"));
}

// A step found damaged and saved again is intact: it counts toward keep like any other.
TEST_F(CheckpointTest, ADamagedCheckpointSavedAgainCountsAgain) {
  for (int64_t step : {3, 4, 5}) save(step, /*keep=*/0);
  for (const char* step : {"/step_00000004", "/step_00000005"})
    fs::resize_file(dir() + step + "/rank_00000.bin", 1);
  checkpoint::Checkpointer ckpt(options(1), {}, *backend);
  EXPECT_EQ(load_quietly(ckpt), 3);
  save_quietly(ckpt, 5);
  EXPECT_TRUE(fs::exists(dir() + "/step_00000005"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000004"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000003"));
}

// `mantissa export` beside a run with checkpoint.keep 1: between the listing and the load the
// run saves step 30 and removes step 20. That is no damage (it was called damaged, and with no
// older checkpoint the export failed): the directory is listed again.
TEST_F(CheckpointTest, ACheckpointRemovedWhileReadIsLookedForAgain) {
  save(10, 1);
  save(20, 1);
  bool saved = false;
  // Two ranks that agree; the first collective (the listing's) lets the run save.
  checkpoint::CheckpointGroup racing{0, 2, [&](double value) {
                                       if (!saved) {
                                         saved = true;
                                         save(30, 1);
                                       }
                                       return 2 * value;
                                     }};
  checkpoint::Checkpointer ckpt(options(1), racing, *backend);
  Slices into = Slices::empty(0, kN);
  testing::internal::CaptureStderr();
  const auto state = ckpt.load_latest(make_state(0).parameters, into.slices);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(state.has_value()) << err;
  EXPECT_EQ(state->step, 30);
  EXPECT_TRUE(into.equals_step(30));
  EXPECT_NE(err.find("step_00000020 was removed while it was read"), std::string::npos) << err;
  EXPECT_EQ(err.find("damaged"), std::string::npos) << err;
}

TEST_F(CheckpointTest, AListingThatFailsIsAnErrorNotAnEmptyDirectory) {
  // Taken for "no checkpoint", a failed listing would start the run afresh, and its first save
  // would remove every checkpoint as newer than its own. Here the directory is a file
  // (ENOTDIR: a setting to fix, exit 2); an I/O error (EIO) is exit 1 the same way.
  fs::create_directories(tmp.path());
  write_file(dir(), "not a directory");
  Slices into = Slices::empty(0, kN);
  try {
    load(into);
    FAIL() << "loaded";
  } catch (const checkpoint::CheckpointUnreadable& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot list the checkpoints in " + dir() + ": " + std::strerror(ENOTDIR));
    EXPECT_EQ(e.kind(), core::ErrorKind::kConfig);
  }
}

TEST_F(CheckpointTest, AFileTheMachineCannotReadStopsTheLoadInsteadOfFallingBack) {
  // A read error is no proof of damage: a retry may read the file, and a fallback would train
  // over the checkpoint. /proc/self/clear_refs opens and then fails every read (EINVAL; a user
  // other than root gets EACCES at the open), as a failing disk's EIO would.
  save(10);
  save(20);
  const std::string manifest = dir() + "/step_00000020/manifest.pb";
  fs::remove(manifest);
  fs::create_symlink("/proc/self/clear_refs", manifest);
  Slices into = Slices::empty(0, kN);
  try {
    load(into);
    FAIL() << "loaded";
  } catch (const checkpoint::CheckpointUnreadable& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.starts_with("checkpoint load: " + manifest + ": ")) << what;
    EXPECT_NE(what.find("not falling back to an older checkpoint"), std::string::npos) << what;
    EXPECT_NE(what.find("move " + dir() + "/step_00000020 aside"), std::string::npos) << what;
    EXPECT_EQ(e.kind(), core::ErrorKind::kFailure) << "EINVAL: a retry may read it";
  }
  EXPECT_TRUE(fs::is_symlink(manifest));
}

// load_step loads exactly the checkpoint asked for, with the same checks as load_latest and
// no fallback; steps() lists what there is, newest first.
TEST_F(CheckpointTest, LoadStepLoadsThatCheckpointOrNothing) {
  save(10);
  save(20);
  checkpoint::Checkpointer ckpt(options(), {}, *backend);
  EXPECT_EQ(ckpt.steps(), (std::vector<int64_t>{20, 10}));
  Slices into = Slices::empty(0, kN);
  const std::optional<checkpoint::CheckpointState> older =
      ckpt.load_step(10, make_state(0).parameters, into.slices);
  ASSERT_TRUE(older.has_value());
  EXPECT_EQ(older->step, 10);
  EXPECT_TRUE(into.equals_step(10));
  EXPECT_FALSE(ckpt.load_step(15, make_state(0).parameters, into.slices).has_value());

  const std::string payload = dir() + "/step_00000010/rank_00000.bin";
  fs::resize_file(payload, fs::file_size(payload) - 1);
  try {
    ckpt.load_step(10, make_state(0).parameters, into.slices);
    FAIL() << "loaded a damaged checkpoint";
  } catch (const checkpoint::CheckpointDamaged& e) {
    EXPECT_NE(std::string(e.what()).find(payload + ": 3599 bytes, the index says 3600"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CheckpointTest, EveryDamagedCheckpointIsAnError) {
  save(10);
  write_file(dir() + "/step_00000010/manifest.pb", "garbage");
  Slices into = Slices::empty(0, kN);
  testing::internal::CaptureStderr();
  try {
    load(into);
    FAIL() << "loaded a damaged checkpoint";
  } catch (const core::Error& e) {
    // A failure (a retry from another copy may work), not a config error, and no location.
    EXPECT_EQ(e.kind(), core::ErrorKind::kFailure) << e.what();
    EXPECT_EQ(std::string(e.what()), "checkpoint load: no intact checkpoint in " + dir() +
                                         ": 1 found, each damaged (see above)");
  }
  EXPECT_NE(testing::internal::GetCapturedStderr().find("manifest.pb: no CRC32C trailer"),
            std::string::npos);
}

TEST_F(CheckpointTest, AnotherModelIsAnErrorNotAFallback) {
  save(10);
  save(20);
  Slices into = Slices::empty(0, kN);
  checkpoint::Checkpointer ckpt(options(), {}, *backend);
  std::vector<checkpoint::ParameterLayout> other = make_state(0).parameters;
  other[1].shape = core::Shape{8};
  try {
    ckpt.load_latest(other, into.slices);
    FAIL() << "loaded a checkpoint of another model";
  } catch (const checkpoint::CheckpointMisfit& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("step_00000020 does not fit this model: parameter 1 is h.0.ln_1.weight [4]"),
        std::string::npos)
        << what;
    // The config it was saved with, for the caller to name what changed.
    EXPECT_EQ(e.config_text(), make_state(20).config_text);
  }
  // A buffer of another size, or one the checkpoint lacks.
  Slices bigger = Slices::empty(0, kN);
  bigger.slices[1].global_numel = kN + 1;
  try {
    ckpt.load_latest(make_state(0).parameters, bigger.slices);
    FAIL() << "loaded a buffer of another size";
  } catch (const checkpoint::CheckpointMisfit&) {
    FAIL() << "a buffer of another size is no other model";
  } catch (const core::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("step_00000020: buffer '" + bigger.slices[1].name + "' is f32[" +
                  std::to_string(kN) + "], the run expects f32[" + std::to_string(kN + 1) + "]"),
        std::string::npos)
        << what;
    EXPECT_EQ(what.find(".cpp:"), std::string::npos) << what;
  }
  std::vector<float> extra(4);
  into.slices.push_back(
      {"sgd_momentum", 4, 0, core::Tensor::wrap(extra.data(), core::Shape{4}, core::DType::kF32)});
  try {
    ckpt.load_latest(make_state(0).parameters, into.slices);
    FAIL() << "loaded a checkpoint without a buffer the run has";
  } catch (const core::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step_00000020 has no buffer 'sgd_momentum' (saved by another setup?)"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find(".cpp:"), std::string::npos) << what;
  }
}

// A checkpoint from before vocabularies were padded to whole 128-row tiles (GPT-2's, before
// 2026-12-01) loads into the padded model: each parameter's saved elements into its place, the
// padding rows and the alignment gaps as zero, into one rank's slices or two. An embedding of
// other rows than padding gives is another model still.
TEST_F(CheckpointTest, AnEmbeddingSavedBeforeVocabularyPaddingLoadsIntoThePaddedModel) {
  save(10);  // wte [10, 4] at 0 and h.0.ln_1.weight [4] at 128, in buffers of kN
  const std::vector<checkpoint::ParameterLayout> padded = {
      {"wte", core::Shape{128, 4}, 0}, {"h.0.ln_1.weight", core::Shape{4}, 512}};
  constexpr int64_t kPadded = 600;
  checkpoint::Checkpointer ckpt(options(), {}, *backend);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, kPadded}, std::vector<int64_t>{0, 250, kPadded}}) {
    std::vector<std::vector<float>> got(std::size(kBuffers), std::vector<float>(kPadded, -1.0f));
    for (size_t part = 0; part + 1 < cuts.size(); ++part) {
      std::vector<checkpoint::BufferSlice> slices;
      for (size_t i = 0; i < std::size(kBuffers); ++i) {
        slices.push_back(
            {kBuffers[i], kPadded, cuts[part],
             core::Tensor::wrap(got[i].data() + cuts[part],
                                core::Shape{cuts[part + 1] - cuts[part]}, core::DType::kF32)});
      }
      ASSERT_TRUE(ckpt.load_latest(padded, slices).has_value());
    }
    for (size_t i = 0; i < std::size(kBuffers); ++i) {
      const std::vector<float> saved = values(kBuffers[i], 10, kN);
      std::vector<float> expected(kPadded, 0.0f);
      std::copy(saved.begin(), saved.begin() + 40, expected.begin());
      std::copy(saved.begin() + 128, saved.begin() + 132, expected.begin() + 512);
      EXPECT_EQ(got[i], expected) << kBuffers[i] << " in " << cuts.size() - 1 << " slices";
    }
  }
  std::vector<checkpoint::ParameterLayout> grown = make_state(0).parameters;
  grown[0].shape = core::Shape{20, 4};
  Slices into = Slices::empty(0, kN);
  EXPECT_THROW(ckpt.load_latest(grown, into.slices), checkpoint::CheckpointMisfit);
}

// A checkpoint past checkpoint.keep that cannot be removed (a file held open on NFS, whose
// removal leaves a .nfs* file behind; a permission) is a warning: the run goes on saving, and
// a later save removes it once it can. Here a directory of root's, read-only, sits in step 10,
// and the saves run as user nobody (setfsuid: file access on this thread only; a user other
// than root needs no switch, the read-only directory alone stops it).
TEST_F(CheckpointTest, ACheckpointThatCannotBeRemovedIsAWarningNotTheEndOfTheRun) {
  save(10, 2);
  save(20, 2);
  const std::string held = dir() + "/step_00000010/held";
  fs::create_directory(held);
  write_file(held + "/file", "held");
  fs::permissions(held, static_cast<fs::perms>(0555));
  const bool root = geteuid() == 0;
  constexpr uid_t kNobody = 65534;
  if (root) {
    if (::chown(tmp.path().c_str(), kNobody, kNobody) != 0) {
      GTEST_SKIP() << "cannot give " << tmp.path() << " to user nobody: " << std::strerror(errno)
                   << " (a user namespace without uid 65534?)";
    }
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(tmp.path())) {
      if (e.path().string().starts_with(held)) continue;
      ASSERT_EQ(::chown(e.path().c_str(), kNobody, kNobody), 0) << e.path();
    }
  }
  testing::internal::CaptureStderr();
  if (root) setfsuid(kNobody);
  const bool reachable = std::ofstream(dir() + "/probe").is_open() && fs::remove(dir() + "/probe");
  if (reachable) {
    save(30, 2);
    save(40, 2);  // phase 1 finds what the removal of step 10 left, and cannot remove it either
  }
  if (root) setfsuid(0);
  const std::string err = testing::internal::GetCapturedStderr();
  if (!reachable) GTEST_SKIP() << "user nobody cannot write into " << dir() << " (TMPDIR?)";
  EXPECT_EQ(read_file(dir() + "/latest"), "step_00000040\n");
  EXPECT_TRUE(fs::exists(dir() + "/step_00000030"));
  EXPECT_FALSE(fs::exists(dir() + "/step_00000020"));
  const std::string removed = dir() + "/step_00000010.removed.tmp";
  EXPECT_TRUE(fs::exists(removed + "/held/file"));
  const std::string why = "cannot remove all '" + removed + "' (at '" + removed +
                          "/held/file'): " + std::strerror(EACCES) +
                          "; the run goes on, the next save tries again\n";
  EXPECT_NE(err.find("mantissa: rank 0: could not remove checkpoint " + dir() +
                     "/step_00000010 (checkpoint.keep 2): " + why),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("mantissa: rank 0: could not remove what an earlier save left, " + removed +
                     ": " + why),
            std::string::npos)
      << err;

  fs::permissions(removed + "/held", static_cast<fs::perms>(0755));
  save(50, 2);
  EXPECT_FALSE(fs::exists(removed));
  Slices into = Slices::empty(0, kN);
  EXPECT_EQ(load(into)->step, 50);
}

// A save that cannot write says what failed and why, once: no source location from the
// collective that rethrows it. A file in the way of its directory (ENOTDIR) is for the user to
// move, a config error (exit 2) as core::path_error_kind has it, which std::filesystem's errors
// now follow too (they had all been failures).
// `latest` only points at the newest checkpoint for people and scripts: when it cannot be
// replaced (a directory in its place), the save of a complete checkpoint still succeeds, with a
// warning, and a load finds that checkpoint by scanning.
TEST_F(CheckpointTest, ALatestThatCannotBeWrittenIsAWarning) {
  save(10);
  fs::remove(dir() + "/latest");
  fs::create_directories(dir() + "/latest");
  testing::internal::CaptureStderr();
  save(20);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("mantissa: rank 0: " + dir() +
                     "/step_00000020 is saved, but latest does "
                     "not name it: "),
            std::string::npos)
      << err;
  Slices into = Slices::empty(0, kN);
  EXPECT_EQ(load(into)->step, 20);
  EXPECT_TRUE(into.equals_step(20));
}

TEST_F(CheckpointTest, ASaveThatCannotWriteSaysWhy) {
  write_file(tmp.path() + "/file", "not a directory");
  checkpoint::CheckpointOptions o = options();
  o.dir = tmp.path() + "/file/ckpt";
  checkpoint::Checkpointer ckpt(o, {}, *backend);
  Slices s(0, kN, 5);
  try {
    ckpt.save(make_state(5), s.slices);
    FAIL() << "saved under a regular file";
  } catch (const core::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), core::ErrorKind::kConfig) << what;
    EXPECT_TRUE(what.starts_with("checkpoint save of " + o.dir + "/step_00000005: ")) << what;
    EXPECT_NE(what.find("'" + o.dir + "': Not a directory"), std::string::npos) << what;
    EXPECT_EQ(what.find("filesystem error"), std::string::npos) << what;
    EXPECT_EQ(what.find(".cpp:"), std::string::npos) << what;
  }
}

// The acceptance test: 1000 random byte flips anywhere in the newest checkpoint's manifest or
// payload. Every one is detected, and the load returns the previous checkpoint, bit for bit.
TEST_F(CheckpointTest, ThousandRandomByteFlipsAreAllDetected) {
  save(10);
  save(20);
  const std::string files[] = {dir() + "/step_00000020/manifest.pb",
                               dir() + "/step_00000020/rank_00000.bin"};
  const std::string originals[] = {read_file(files[0]), read_file(files[1])};
  const size_t total = originals[0].size() + originals[1].size();
  std::mt19937_64 rng(2024);
  int manifest_flips = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    size_t at = rng() % total;
    const int f = at < originals[0].size() ? 0 : 1;
    if (f == 1) at -= originals[0].size();
    manifest_flips += f == 0;
    std::string damaged = originals[f];
    damaged[at] = static_cast<char>(damaged[at] ^ (1 + rng() % 255));  // never a no-op
    write_file(files[f], damaged);

    Slices into = Slices::empty(0, kN);
    testing::internal::CaptureStderr();
    const std::optional<checkpoint::CheckpointState> loaded = load(into);
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(loaded.has_value());
    ASSERT_EQ(loaded->step, 10) << "flip of byte " << at << " in " << files[f] << " undetected";
    ASSERT_TRUE(into.equals_step(10)) << "flip of byte " << at << " in " << files[f];
    ASSERT_NE(err.find(files[f]), std::string::npos) << "the message names the file: " << err;
    write_file(files[f], originals[f]);
  }
  EXPECT_GT(manifest_flips, 50);  // both files were hit
  Slices into = Slices::empty(0, kN);
  EXPECT_EQ(load(into)->step, 20);  // restored: intact again
  EXPECT_TRUE(into.equals_step(20));
}

// --- several ranks, simulated by threads -----------------------------------------------------

namespace {

// The sum callback for `world` threads: a barrier whose completion publishes the sum of one
// round (exact for the integers the checkpointer passes, in any order).
class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), barrier_(world, Completion{this}) {}

  checkpoint::CheckpointGroup group(int rank) {
    return {rank, world_, [this, rank](double value) {
              {
                std::lock_guard lock(mutex_);
                round_sum_ += value;
              }
              barrier_.arrive_and_wait();  // the completion published round_sum_ into result_
              const double result = result_;
              barrier_.arrive_and_wait();  // nobody starts the next round before all read it
              if (after_round) after_round(rank);
              return result;
            }};
  }

  // Called on every rank after every round: a fault injected between two phases of a save.
  std::function<void(int rank)> after_round;

  // Runs body(rank) on `world` threads; rethrows the first failure.
  void run(const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r)
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct Completion {
    ThreadGroup* g;
    void operator()() noexcept {
      // Runs once per phase: after the arrival phase it publishes, after the read phase it
      // resets. Every round has two phases, so alternate.
      if (!g->publishing_) {
        g->result_ = g->round_sum_;
        g->round_sum_ = 0.0;
      }
      g->publishing_ = !g->publishing_;
    }
  };
  int world_;
  std::mutex mutex_;
  double round_sum_ = 0.0;
  double result_ = 0.0;
  bool publishing_ = false;
  std::barrier<Completion> barrier_;
};

// Rank r's shard of kN elements over `world` ranks (the last one takes the remainder).
std::pair<int64_t, int64_t> shard(int rank, int world) {
  const int64_t per = kN / world;
  return {rank * per, rank == world - 1 ? kN : (rank + 1) * per};
}

}  // namespace

TEST_F(CheckpointTest, Zero1ShardsResumeOnAnotherWorldSize) {
  // Saved by 3 ranks, each writing its shard of every buffer.
  for (int64_t step : {10, 20}) {
    ThreadGroup saving(3);
    saving.run([&](int rank) {
      const auto [b, e] = shard(rank, 3);
      Slices s(b, e, step);
      checkpoint::Checkpointer ckpt(options(), saving.group(rank), *backend);
      ckpt.save(make_state(step), s.slices);
    });
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir() + "/step_00000020"))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"manifest.pb", "rank_00000.bin", "rank_00001.bin",
                                             "rank_00002.bin"}));

  // Loaded by `world` ranks (a ZeRO-1 run): every rank takes its new shard of every buffer,
  // the masters too, which is all a ZeRO-1 rank keeps of them.
  auto load_on = [&](int world, int64_t expected_step) {
    ThreadGroup loading(world);
    loading.run([&](int rank) {
      const auto [b, e] = shard(rank, world);
      Slices mine = Slices::empty(b, e);
      checkpoint::Checkpointer ckpt(options(), loading.group(rank), *backend);
      const auto state = ckpt.load_latest(make_state(0).parameters, mine.slices);
      ASSERT_TRUE(state.has_value());
      EXPECT_EQ(state->step, expected_step);
      EXPECT_EQ(state->world_size, 3);
      EXPECT_TRUE(mine.equals_step(expected_step)) << "rank " << rank << " of " << world;
    });
  };
  load_on(2, 20);
  load_on(4, 20);
  load_on(1, 20);  // whole buffers: a single rank, or `mantissa export`

  // Damage in a part only rank 1 reads (the last piece of adam_v): rank 1 finds it, and both
  // ranks fall back together.
  const std::string payload = dir() + "/step_00000020/rank_00002.bin";
  std::string bytes = read_file(payload);
  bytes.back() = static_cast<char>(bytes.back() ^ 0x40);
  write_file(payload, bytes);
  testing::internal::CaptureStderr();
  load_on(2, 10);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("rank 1: checkpoint " + dir() + "/step_00000020 is damaged"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("buffer 'adam_v'"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 0: checkpoint " + dir() + "/step_00000020 is damaged on another rank"),
            std::string::npos)
      << err;
}

// A save that fails on one rank for something a retry meets again (a directory where its
// payload goes: a config error, exit 2) ends every rank with that kind. The other ranks had
// ended with kFailure (exit 1), so the job's exit code depended on which rank ended it first;
// their message names the rank that failed.
TEST_F(CheckpointTest, ASaveFailingOnOneRankEndsEveryRankWithItsKind) {
  save(5);
  ThreadGroup saving(2);
  const std::string tmp_dir = dir() + "/step_00000007.tmp";
  const std::string obstacle = tmp_dir + "/rank_00001.bin";
  saving.after_round = [&](int rank) {
    // Once rank 0 has made the temporary directory (the save's first phase), before the
    // payloads are written.
    if (rank == 1 && fs::exists(tmp_dir) && !fs::exists(obstacle)) fs::create_directory(obstacle);
  };
  std::vector<std::optional<core::ErrorKind>> kinds(2);
  std::vector<std::string> messages(2);
  const auto note = [&](int rank, const std::function<void()>& body) {
    try {
      body();
    } catch (const core::Error& e) {
      kinds[static_cast<size_t>(rank)] = e.kind();
      messages[static_cast<size_t>(rank)] = e.what();
    }
  };
  saving.run([&](int rank) {
    const auto [b, e] = shard(rank, 2);
    Slices s(b, e, 7);
    checkpoint::Checkpointer ckpt(options(), saving.group(rank), *backend);
    note(rank, [&] { ckpt.save(make_state(7), s.slices); });
  });
  EXPECT_EQ(kinds[1], core::ErrorKind::kConfig) << messages[1];
  EXPECT_NE(messages[1].find("cannot create '" + obstacle + "'"), std::string::npos) << messages[1];
  EXPECT_EQ(kinds[0], core::ErrorKind::kConfig) << messages[0];
  EXPECT_NE(messages[0].find("checkpoint save of " + dir() +
                             "/step_00000007: failed on rank 1 (see its message)"),
            std::string::npos)
      << messages[0];
  EXPECT_FALSE(fs::exists(dir() + "/step_00000007"));
  EXPECT_FALSE(fs::exists(tmp_dir)) << "rank 0's payload stays on the disk that failed the save";
}

// A rank may pass no slices while another passes whole buffers.
TEST_F(CheckpointTest, OneRankMayWriteEverything) {
  ThreadGroup saving(2);
  saving.run([&](int rank) {
    Slices s(0, kN, 5);
    checkpoint::Checkpointer ckpt(options(), saving.group(rank), *backend);
    ckpt.save(make_state(5), rank == 0 ? s.slices : std::vector<checkpoint::BufferSlice>{});
  });
  EXPECT_FALSE(fs::exists(dir() + "/step_00000005/rank_00001.bin"));
  Slices into = Slices::empty(0, kN);
  const auto state = load(into);  // resumed alone
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->world_size, 2);
  EXPECT_TRUE(into.equals_step(5));
}

TEST_F(CheckpointTest, SlicesThatDoNotTileAreRefusedOnEveryRank) {
  // Both ranks claim the first half: the second half is missing and the save fails everywhere,
  // publishing nothing.
  ThreadGroup saving(2);
  std::atomic<int> failures = 0;
  saving.run([&](int rank) {
    Slices s(0, kN / 2, 5);
    checkpoint::Checkpointer ckpt(options(), saving.group(rank), *backend);
    try {
      ckpt.save(make_state(5), s.slices);
    } catch (const core::Error& e) {
      ++failures;
      if (rank == 0) {
        EXPECT_NE(std::string(e.what()).find("stored twice"), std::string::npos) << e.what();
      }
    }
  });
  EXPECT_EQ(failures, 2);
  checkpoint::Checkpointer ckpt(options(), {}, *backend);
  EXPECT_TRUE(ckpt.steps().empty());
  EXPECT_FALSE(fs::exists(dir() + "/step_00000005.tmp")) << "the payloads stay on the disk";
}

// A rank whose file system lists other checkpoints (a stale directory cache on one node) would
// load another step, or none, and the ranks would run on from different states: every rank
// stops instead, each naming what it sees.
TEST_F(CheckpointTest, RanksThatListDifferentCheckpointsAllStop) {
  save(10);
  save(20);
  const std::string stale = tmp.path() + "/stale";
  fs::create_directories(stale);
  fs::copy(dir() + "/step_00000010", stale + "/step_00000010", fs::copy_options::recursive);
  const std::string empty = tmp.path() + "/empty";
  fs::create_directories(empty);
  // load_latest, load_step, and agreed_steps (what checkpoint.resume NEVER checks).
  for (const std::string& other : {stale, empty}) {
    for (int call : {0, 1, 2}) {
      ThreadGroup loading(2);
      std::vector<std::string> errors(2);
      loading.run([&](int rank) {
        checkpoint::CheckpointOptions o = options();
        if (rank == 1) o.dir = other;
        Slices into = Slices::empty(0, kN);
        checkpoint::Checkpointer ckpt(o, loading.group(rank), *backend);
        try {
          if (call == 0) ckpt.load_latest(make_state(0).parameters, into.slices);
          if (call == 1) ckpt.load_step(10, make_state(0).parameters, into.slices);
          if (call == 2) ckpt.agreed_steps();
        } catch (const core::Error& e) {
          errors[static_cast<size_t>(rank)] = e.what();
        }
      });
      const std::string rank1_sees = other == empty ? "none" : "step_00000010";
      EXPECT_NE(errors[0].find("the ranks list different checkpoints in " + dir() +
                               " (rank 0: step_00000020, step_00000010)"),
                std::string::npos)
          << errors[0];
      EXPECT_NE(errors[1].find("(rank 1: " + rank1_sees + ")"), std::string::npos) << errors[1];
    }
  }
}
