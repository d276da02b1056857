#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

#include "checkpoint/checkpoint_manifest.h"
#include "checkpoint/crc32c.h"
#include "core/durable_file.h"
#include "core/strings.h"
#include "core/unique_fd.h"

namespace fs = std::filesystem;

namespace mantissa::checkpoint {
namespace {

constexpr const char* kManifestName = "manifest.pb";
constexpr const char* kLatestName = "latest";
// step_<N> is written as step_<N>.tmp and removed as step_<N>.removed.tmp: neither is a
// checkpoint, and a save's first phase clears what a crash left of either.
constexpr std::string_view kUnfinishedSuffix = ".tmp";
constexpr std::string_view kRemovedSuffix = ".removed.tmp";

bool is_left_by_a_crash(const std::string& name) {
  return name.starts_with("step_") && name.ends_with(kUnfinishedSuffix);
}

// --- writing: every failure is a core::Error naming the path -------------------------------

void write_file_durably(const std::string& path, const std::string& bytes) {
  core::DurableFile out(path);
  out.write(bytes.data(), bytes.size());
  out.finish();
}

// --- reading: every failure names the path ------------------------------------------------

// A file missing, or a directory in its place, leaves the checkpoint incomplete: damaged, and a
// load falls back past it. Any other reason to fail is the machine's: unreadable, and a load
// stops.
[[noreturn]] void throw_read_error(const std::string& what, int error) {
  const std::string text = what + ": " + std::strerror(error);
  if (error == ENOENT || error == EISDIR || error == ENOTDIR) throw CheckpointDamaged(text);
  throw CheckpointUnreadable(text, core::path_error_kind(error));
}

// A checkpoint file's bytes (core::read_whole_file's errors are a config's: these say damaged
// or unreadable, which decides whether a load falls back).
std::string read_checkpoint_file(const std::string& path) {
  const core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_read_error(path + ": cannot open", errno);
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_read_error(path + ": read failed", errno);
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

// Reads bytes [offset, offset + size) of `path`; a file shorter than that is damaged.
void read_range(const std::string& path, uint64_t offset, size_t size, char* out) {
  const core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_read_error(path + ": cannot open", errno);
  while (size > 0) {
    const ssize_t n = ::pread(fd.get(), out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      const std::string what = path + ": read at byte " + std::to_string(offset) + " failed";
      if (n == 0) throw CheckpointDamaged(what + ": unexpected end of file");
      throw_read_error(what, error);
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

// `count` flat elements of a checkpoint's buffer, from element `src`, that load into the model's
// from element `dst`.
struct Segment {
  int64_t dst = 0;
  int64_t src = 0;
  int64_t count = 0;
};

// How a checkpoint whose parameters are laid out as `saved` loads into a model laid out as
// `model`, where the two differ: only as a checkpoint from before vocabularies were padded to
// whole 128-row tiles (GPT-2's, before 2026-12-01) differs, the same parameters with embedding
// tables of fewer rows. One segment a parameter; what none covers (the padding rows, the gaps
// that align the parameters) loads as zero, as the padding of a fresh model is. Nothing when
// the parameters differ otherwise (their offsets may: they follow the rows). A first dimension
// rounded up to 128 rows is taken for padding wherever it is: the callers then check the
// model config the checkpoint recorded (a wpe of 1000 -> 1024 positions is another seq_len).
// Empty when the layouts are not so related.
std::vector<Segment> padding_segments(const std::vector<ParameterLayout>& saved,
                                      const std::vector<ParameterLayout>& model) {
  if (saved.size() != model.size()) return {};
  std::vector<Segment> segments;
  for (size_t i = 0; i < saved.size(); ++i) {
    const core::Shape& a = saved[i].shape;
    const core::Shape& b = model[i].shape;
    if (saved[i].name != model[i].name || a.rank() != b.rank() || a.rank() == 0) return {};
    for (int d = 1; d < a.rank(); ++d) {
      if (a[d] != b[d]) return {};
    }
    const bool padded = a[0] % 128 != 0 && b[0] == (a[0] + 127) / 128 * 128;
    if (a[0] != b[0] && !padded) return {};
    segments.push_back({model[i].offset, saved[i].offset, a.numel()});
  }
  return segments;
}

// Removes the checkpoint directory `dir`. It is renamed first, to a name that is no checkpoint's
// and that the next save's first phase clears, so that a crash part way leaves no partial
// step_<N> to count as a (damaged) checkpoint against checkpoint.keep.
void remove_checkpoint_dir(const std::string& dir) {
  const std::string doomed = dir + std::string(kRemovedSuffix);
  fs::remove_all(doomed);
  fs::rename(dir, doomed);
  fs::remove_all(doomed);
}

void warn(int rank, const std::string& message) {
  // One write per line: ranks that share a stderr (threads in the tests, or ranks whose
  // output a launcher merges) must not interleave inside each other's lines.
  const std::string line = "mantissa: rank " + std::to_string(rank) + ": " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// Removes what a save no longer needs (a checkpoint past checkpoint.keep, what a crashed save
// or removal left behind) with `remove`. A failure is a warning, not the end of the run: the
// checkpoint just written is complete and published, and a failure here repeats at every save
// of a resumed run until someone acts (a file held open on NFS, whose removal leaves a .nfs*
// file in the directory; a permission). What stays is counted and tried again at the next save.
void remove_or_warn(int rank, const std::string& what, const std::function<void()>& remove) {
  try {
    remove();
  } catch (const fs::filesystem_error& e) {
    warn(rank, "could not remove " + what + ": " + core::filesystem_error_text(e) +
                   "; the run goes on, the next save tries again");
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

std::vector<int64_t> list_checkpoints(const std::string& dir) {
  // A listing that fails is no empty listing: the run would start afresh and its first save
  // would remove every checkpoint as newer than its own.
  const auto failed = [&](const std::error_code& ec) {
    throw CheckpointUnreadable("cannot list the checkpoints in " + dir + ": " + ec.message(),
                               core::path_error_kind(ec.value()));
  };
  std::vector<int64_t> steps;
  std::error_code ec;
  fs::directory_iterator entries(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return steps;  // no checkpoint yet
  if (ec) failed(ec);
  for (; entries != fs::directory_iterator(); entries.increment(ec)) {
    const std::string name = entries->path().filename().string();
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    // Only checkpoint_dir_name's own spelling (8 digits, more without a leading 0): a copy
    // named step_000000002 would be listed as step 2 and then read from step_00000002.
    const bool is_step =
        name.starts_with("step_") && digits.size() >= 8 && digits.size() <= 18 &&
        (digits.size() == 8 || digits[0] != '0') &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!is_step) continue;
    std::error_code entry_ec;  // removed since the listing: not a checkpoint
    const bool is_directory = entries->is_directory(entry_ec);
    if (entry_ec && entry_ec != std::errc::no_such_file_or_directory) failed(entry_ec);
    if (is_directory) steps.push_back(std::stoll(digits));
  }
  if (ec) failed(ec);  // the listing stopped part way
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

namespace {

// The manifest of checkpoint `step` in `dir`; CheckpointDamaged also when it is of another step.
Manifest read_manifest(const std::string& dir, int64_t step) {
  const std::string path = dir + "/" + checkpoint_dir_name(step) + "/" + kManifestName;
  Manifest m = decode_manifest(read_checkpoint_file(path), path);
  // A directory renamed or copied by hand (a backup put back as a newer step) would otherwise
  // resume at another step than its name says, and the next save would roll back over, and
  // remove, the checkpoints between.
  if (m.state.step != step) {
    throw CheckpointDamaged(path + ": the manifest is of step " + std::to_string(m.state.step) +
                            ", its directory's name of step " + std::to_string(step) +
                            " (renamed or copied from another checkpoint?)");
  }
  return m;
}

}  // namespace

ReplicaPart replica_part(int64_t n, int rank, int size) {
  const int64_t begin = n * rank / size;
  return {begin, n * (rank + 1) / size - begin};
}

std::vector<ParameterLayout> parameter_layout(const train::ParameterStore& params) {
  std::vector<ParameterLayout> layout;
  for (const train::Parameter& p : params.all())
    layout.push_back({p.spec.name, p.spec.shape, p.offset});
  return layout;
}

std::string no_checkpoint_reason(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return "does not exist";
  std::vector<std::string> unfinished;
  bool empty = true;
  for (fs::directory_iterator entries(dir, ec); !ec && entries != fs::directory_iterator();
       entries.increment(ec)) {
    empty = false;
    const std::string name = entries->path().filename().string();
    if (is_left_by_a_crash(name) && !name.ends_with(kRemovedSuffix)) {
      unfinished.push_back(name);
    }
  }
  if (empty) return "is empty";
  if (unfinished.empty()) return "holds no step_<8 digits> directory";
  std::sort(unfinished.begin(), unfinished.end());
  return "holds only " +
         std::string(unfinished.size() == 1 ? "an unfinished save (" : "unfinished saves (") +
         core::join(unfinished, ", ") + "), which a run killed while saving leaves";
}

BufferSlice whole_masters(train::ParameterStore& params) {
  return {kMastersBuffer, params.flat_numel(), 0, params.masters()};
}

Checkpointer::Checkpointer(CheckpointOptions options, CheckpointGroup group, core::Backend& backend)
    : Checkpointer(std::move(options), std::move(group)) {
  backend_ = &backend;
}

Checkpointer::Checkpointer(CheckpointOptions options, CheckpointGroup group)
    : options_(std::move(options)), group_(std::move(group)) {
  MANTISSA_CHECK(!options_.dir.empty(), "checkpoint: no directory given");
  MANTISSA_CHECK(options_.keep >= 0, "checkpoint.keep must be >= 0, got " << options_.keep);
  MANTISSA_CHECK(options_.max_entry_bytes >= 8,
                 "checkpoint: max_entry_bytes must be >= 8, got " << options_.max_entry_bytes);
  MANTISSA_CHECK(group_.world_size >= 1 && group_.rank >= 0 && group_.rank < group_.world_size,
                 "checkpoint: rank " << group_.rank << " of " << group_.world_size);
  MANTISSA_CHECK(group_.world_size == 1 || group_.sum,
                 "checkpoint: " << group_.world_size << " ranks need a sum callback");
}

std::optional<CheckpointState> Checkpointer::newest_manifest() const {
  for (const int64_t step : steps()) {
    try {
      return read_manifest(options_.dir, step).state;
    } catch (const CheckpointDamaged&) {
      // The load falls back past it too.
    }
  }
  return std::nullopt;
}

std::vector<int64_t> Checkpointer::steps() const {
  return list_checkpoints(options_.dir);
}

bool Checkpointer::agree(bool ok) const {
  return group_.sum ? group_.sum(ok ? 0.0 : 1.0) == 0.0 : ok;
}

core::ErrorKind Checkpointer::agreed_kind(std::optional<core::ErrorKind> mine) const {
  return agree(mine != core::ErrorKind::kConfig) ? core::ErrorKind::kFailure
                                                 : core::ErrorKind::kConfig;
}

std::vector<int64_t> Checkpointer::agreed_steps() const {
  const std::vector<int64_t> found = steps();
  if (group_.world_size == 1) return found;
  // The ranks compare a CRC of their lists: an integer below 2^32, so the sum over up to 2^21
  // ranks is exact and equals world_size times this rank's CRC on every rank only when they
  // all hold the same one.
  const double listing = crc32c(found.data(), found.size() * sizeof(int64_t));
  const double mean = group_.sum(listing) / group_.world_size;
  if (agree(listing == mean)) return found;
  const std::string names = core::join(found, ", ", checkpoint_dir_name);
  throw core::Error("checkpoint listing: the ranks list different checkpoints in " + options_.dir +
                    " (rank " + std::to_string(group_.rank) + ": " +
                    (names.empty() ? "none" : names) +
                    "): every rank must see the same directory on a shared file system");
}

void Checkpointer::collective(const std::string& what, const std::function<void()>& phase) {
  std::string error;
  core::ErrorKind kind = core::ErrorKind::kFailure;  // any other exception
  try {
    phase();
  } catch (const core::Error& e) {
    error = e.what();
    kind = e.kind();
  } catch (const fs::filesystem_error& e) {
    error = core::error_text(e);
    kind = core::path_error_kind(e.code().value());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (agree(error.empty())) return;
  // The ranks that failed, for the others' messages (every rank takes part in the sums): which
  // one, where only one did (a full disk or a failing mount on one node), else how many. Alone,
  // this rank is the one that failed.
  const bool failed = !error.empty();
  std::string elsewhere;
  if (group_.sum) {
    const double count = group_.sum(failed ? 1.0 : 0.0);
    const double rank_sum = group_.sum(failed ? group_.rank : 0.0);
    elsewhere = count == 1.0 ? "failed on rank " + std::to_string(static_cast<int64_t>(rank_sum)) +
                                   " (see its message)"
                             : "failed on " + std::to_string(static_cast<int64_t>(count)) +
                                   " ranks (see their messages)";
  }
  // The phase's message, with nothing appended (a defect's message already ends with its
  // source location).
  core::throw_error_of_kind(agreed_kind(failed ? std::optional(kind) : std::nullopt),
                            what + ": " + (failed ? error : elsewhere));
}

// The bytes of a contiguous tensor in host memory: the tensor itself on the host, else a copy
// in `staging`.
const void* Checkpointer::host_bytes(const core::Tensor& t, core::Tensor& staging) {
  if (t.device().is_cpu()) return t.data();
  MANTISSA_CHECK(backend_, "checkpoint: " << t.describe() << " needs a backend to copy it");
  staging = core::Tensor::empty(t.shape(), t.dtype(), core::Device::cpu());
  backend_->copy(t, staging);
  backend_->synchronize();
  return staging.data();
}

void Checkpointer::write_payload(const std::string& dir, const std::vector<BufferSlice>& slices,
                                 ShardIndex& index) {
  if (slices.empty()) return;
  const std::string file = payload_file_name(group_.rank);
  core::DurableFile out(dir + "/" + file);
  if (backend_) backend_->synchronize();  // the tensors may still be written by queued work
  uint64_t offset = 0;
  for (const BufferSlice& slice : slices) {
    const core::Tensor& data = slice.data;
    MANTISSA_CHECK(!slice.name.empty() && data.defined(),
                   "checkpoint save: a slice needs a name and data");
    MANTISSA_CHECK(slice.begin >= 0 && slice.begin <= slice.global_numel - data.numel(),
                   "checkpoint save: slice '" << slice.name << "' [" << slice.begin << ", +"
                                              << data.numel() << ") outside its buffer of "
                                              << slice.global_numel << " elements");
    const int64_t element_size = static_cast<int64_t>(core::dtype_size(data.dtype()));
    const int64_t per_entry = std::max<int64_t>(1, options_.max_entry_bytes / element_size);
    // An empty slice still gets an entry, so that its buffer exists in the index.
    for (int64_t first = 0; first == 0 || first < data.numel(); first += per_entry) {
      const int64_t count = std::min(per_entry, data.numel() - first);
      const core::Tensor piece = data.view(first, core::Shape{count});
      core::Tensor staging;
      const void* bytes = host_bytes(piece, staging);
      TensorEntry& e = *index.add_tensors();
      e.set_name(slice.name);
      e.set_dtype(to_proto_dtype(data.dtype()));
      e.add_shape(slice.global_numel);
      e.set_element_begin(slice.begin + first);
      e.set_element_count(count);
      e.set_file(file);
      e.set_byte_offset(offset);
      e.set_byte_length(piece.nbytes());
      e.set_crc32c(crc32c(bytes, piece.nbytes()));
      out.write(bytes, piece.nbytes());
      offset += piece.nbytes();
    }
  }
  out.finish();
}

std::string Checkpointer::save(const CheckpointState& state,
                               const std::vector<BufferSlice>& slices) {
  MANTISSA_CHECK(state.step >= 0, "checkpoint save: negative step " << state.step);
  const std::string name = checkpoint_dir_name(state.step);
  const std::string final_dir = options_.dir + "/" + name;
  const std::string tmp_dir = final_dir + std::string(kUnfinishedSuffix);
  const std::string what = "checkpoint save of " + final_dir;
  // A save that fails leaves nothing behind: once the failure is agreed every rank has stopped
  // writing, and rank 0 removes the temporary directory, which may hold nearly a whole
  // checkpoint on the full disk that failed it (best effort: the next save clears it too).
  const auto phase = [&](const std::function<void()>& body) {
    try {
      collective(what, body);
    } catch (...) {
      std::error_code ignored;
      if (group_.rank == 0) fs::remove_all(tmp_dir, ignored);
      throw;
    }
  };

  // 1. Rank 0 makes an empty temporary directory, clearing what a crashed save left behind
  //    (temporaries of `latest` too: rank 0 alone replaces it).
  phase([&] {
    if (group_.rank != 0) return;
    fs::create_directories(options_.dir);
    core::remove_temporaries_of(options_.dir + "/" + kLatestName);
    for (const fs::directory_entry& entry : fs::directory_iterator(options_.dir)) {
      const std::string n = entry.path().filename().string();
      if (!is_left_by_a_crash(n)) continue;
      if (entry.path() == tmp_dir) {
        fs::remove_all(entry.path());  // this save's own directory must start empty
      } else {
        remove_or_warn(group_.rank, "what an earlier save left, " + entry.path().string(),
                       [&] { fs::remove_all(entry.path()); });
      }
    }
    fs::create_directory(tmp_dir);
  });

  // 2. Every rank writes its payload and its part of the index, both synced.
  phase([&] {
    ShardIndex index;
    index.set_rank(group_.rank);
    write_payload(tmp_dir, slices, index);
    write_file_durably(tmp_dir + "/" + payload_file_name(group_.rank) + ".index",
                       seal_message(index));
  });

  // 3. Rank 0 merges the index into the manifest, validates it as a load would, and publishes
  //    the directory: rename, then `latest`, then pruning.
  phase([&] {
    if (group_.rank != 0) return;
    CheckpointState saved = state;
    saved.world_size = group_.world_size;
    TrainState manifest = state_to_proto(saved);
    for (int r = 0; r < group_.world_size; ++r) {
      const std::string path = tmp_dir + "/" + payload_file_name(r) + ".index";
      ShardIndex index;
      unseal_message(read_checkpoint_file(path), index, path);
      MANTISSA_CHECK(index.rank() == r, path << ": written by rank " << index.rank());
      for (const TensorEntry& e : index.tensors()) *manifest.add_tensors() = e;
    }
    const std::string bytes = seal_message(manifest);
    decode_manifest(bytes, final_dir + "/" + kManifestName);  // the slices must tile buffers
    write_file_durably(tmp_dir + "/" + kManifestName, bytes);
    for (int r = 0; r < group_.world_size; ++r)
      fs::remove(tmp_dir + "/" + payload_file_name(r) + ".index");
    core::fsync_path(tmp_dir);

    if (fs::exists(final_dir)) {
      // Left by an earlier attempt that reached this step: damaged (the load fell back past
      // it) or newer than the checkpoint a run was told to resume from.
      warn(group_.rank, "replacing checkpoint " + final_dir + ", left by an earlier attempt");
      remove_checkpoint_dir(final_dir);
    }
    fs::rename(tmp_dir, final_dir);
    damaged_steps_.erase(state.step);
    core::fsync_path(options_.dir);
    // `latest` is for people and scripts: the checkpoint is published by its rename above, and
    // a load scans the directories. A pointer that cannot be written (a directory in its
    // place) is a warning, not a failed save of a complete checkpoint.
    try {
      core::write_file_atomically(options_.dir + "/" + kLatestName, name + "\n");
    } catch (const core::Error& e) {
      warn(group_.rank,
           final_dir + " is saved, but " + kLatestName + " does not name it: " + e.what());
    }

    // Newest first. A checkpoint the load fell back past takes no intact one's place: counted,
    // it would push out the one the run resumed from, leaving one fewer to fall back to.
    int kept = 0;
    for (int64_t step : list_checkpoints(options_.dir)) {
      const std::string dir = options_.dir + "/" + checkpoint_dir_name(step);
      const bool damaged = damaged_steps_.contains(step);
      if (step > state.step) {
        warn(group_.rank, "removing checkpoint " + dir + ": newer than the one just written " +
                              "(left by a run that resumed from an earlier step)");
        remove_checkpoint_dir(dir);
      } else if (options_.keep > 0 && (damaged ? kept >= options_.keep : ++kept > options_.keep)) {
        remove_or_warn(group_.rank,
                       "checkpoint " + dir + (damaged ? " (damaged, " : " (") + "checkpoint.keep " +
                           std::to_string(options_.keep) + ")",
                       [&] { remove_checkpoint_dir(dir); });
      }
    }
  });
  return final_dir;
}

CheckpointState Checkpointer::load_one(int64_t step, const std::vector<ParameterLayout>& layout,
                                       const std::vector<BufferSlice>& slices) {
  const std::string dir = options_.dir + "/" + checkpoint_dir_name(step);
  const Manifest m = read_manifest(options_.dir, step);

  // Empty where the checkpoint's buffers load element for element.
  std::vector<Segment> remap;
  if (m.state.parameters != layout) {
    remap = padding_segments(m.state.parameters, layout);
    if (remap.empty()) {
      std::string difference = "a different number of parameters (" +
                               std::to_string(m.state.parameters.size()) + " saved, " +
                               std::to_string(layout.size()) + " in the model)";
      for (size_t i = 0; i < std::min(layout.size(), m.state.parameters.size()); ++i) {
        const ParameterLayout& a = m.state.parameters[i];
        const ParameterLayout& b = layout[i];
        if (a == b) continue;
        difference = "parameter " + std::to_string(i) + " is " + a.name + " " + a.shape.str() +
                     " at " + std::to_string(a.offset) + " in the checkpoint, " + b.name + " " +
                     b.shape.str() + " at " + std::to_string(b.offset) + " in the model";
        break;
      }
      throw CheckpointMisfit(dir + " does not fit this model: " + difference, m.state.config_text);
    }
  }
  // A truncated (or grown) file is found here even when this rank reads none of it.
  for (const auto& [file, size] : payload_files(m)) {
    const std::string path = dir + "/" + file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_read_error(path + ": cannot stat", errno);
    if (static_cast<uint64_t>(st.st_size) != size)
      throw CheckpointDamaged(path + ": " + std::to_string(st.st_size) + " bytes, the index says " +
                              std::to_string(size) + " (truncated or overwritten)");
  }

  std::vector<char> staging;
  for (const BufferSlice& slice : slices) {
    const core::Tensor& data = slice.data;
    MANTISSA_CHECK(data.defined(), "checkpoint load: slice '" << slice.name << "' has no data");
    const auto found = std::find_if(m.buffers.begin(), m.buffers.end(), [&](const auto& entries) {
      return entries[0].name() == slice.name;
    });
    MANTISSA_REQUIRE(found != m.buffers.end(), kConfig,
                     dir << " has no buffer '" << slice.name << "' (saved by another setup?)");
    const TensorEntry& first = (*found)[0];
    const core::DType dtype = from_proto_dtype(first.dtype(), dir);
    // The model's size, or, remapped, at least up to the last parameter's end.
    const int64_t saved_numel =
        remap.empty() ? slice.global_numel : remap.back().src + remap.back().count;
    const bool fits = remap.empty() ? first.shape(0) == saved_numel : first.shape(0) >= saved_numel;
    MANTISSA_REQUIRE(fits && dtype == data.dtype(), kConfig,
                     dir << ": buffer '" << slice.name << "' is " << core::dtype_name(dtype) << "["
                         << first.shape(0) << "], the run expects "
                         << core::dtype_name(data.dtype()) << "[" << saved_numel << "]");
    const int64_t begin = slice.begin;
    const int64_t end = slice.begin + data.numel();
    MANTISSA_CHECK(begin >= 0 && end <= slice.global_numel,
                   "checkpoint load: slice '" << slice.name << "' [" << begin << ", " << end
                                              << ") outside its buffer");
    const std::vector<Segment> segments =
        remap.empty() ? std::vector<Segment>{{0, 0, slice.global_numel}} : remap;
    if (!remap.empty()) {
      core::Tensor all = data;
      if (all.device().is_cpu()) {
        std::memset(all.data(), 0, all.nbytes());
      } else {
        MANTISSA_CHECK(backend_, "checkpoint: " << all.describe() << " needs a backend to fill it");
        backend_->fill(all, 0.0f);
      }
    }
    const size_t element_size = core::dtype_size(dtype);
    for (const TensorEntry& e : *found) {
      const int64_t e_begin = e.element_begin();
      const int64_t e_end = e_begin + e.element_count();
      bool read = false;
      for (const Segment& s : segments) {
        // The segment's elements in this entry whose destinations lie in [begin, end).
        const int64_t lo = std::max({e_begin, s.src, s.src + (begin - s.dst)});
        const int64_t hi = std::min({e_end, s.src + s.count, s.src + (end - s.dst)});
        if (lo >= hi) continue;
        if (!read) {
          // The whole entry is read once, since its CRC covers all of it.
          const std::string path = dir + "/" + e.file();
          staging.resize(e.byte_length());
          read_range(path, e.byte_offset(), e.byte_length(), staging.data());
          const uint32_t crc = crc32c(staging.data(), staging.size());
          if (crc != e.crc32c()) {
            char hex[64];
            std::snprintf(hex, sizeof hex, "stored 0x%08x, computed 0x%08x", e.crc32c(), crc);
            throw CheckpointDamaged(path + ": buffer '" + e.name() + "' elements [" +
                                    std::to_string(e_begin) + ", " + std::to_string(e_end) +
                                    "): CRC32C mismatch (" + hex + ")");
          }
          read = true;
        }
        const char* src = staging.data() + (lo - e_begin) * element_size;
        core::Tensor dst = data.view(s.dst + (lo - s.src) - begin, core::Shape{hi - lo});
        if (dst.device().is_cpu()) {
          std::memcpy(dst.data(), src, dst.nbytes());
        } else {
          MANTISSA_CHECK(backend_,
                         "checkpoint: " << dst.describe() << " needs a backend to fill it");
          backend_->copy(core::Tensor::wrap(const_cast<char*>(src), dst.shape(), dtype), dst);
          backend_->synchronize();  // staging is reused by the next entry
        }
      }
    }
  }
  return m.state;
}

std::optional<CheckpointState> Checkpointer::load_agreed(int64_t step,
                                                         const std::vector<ParameterLayout>& layout,
                                                         const std::vector<BufferSlice>& slices,
                                                         std::string& damage) {
  const std::string dir = options_.dir + "/" + checkpoint_dir_name(step);
  CheckpointState state;
  std::string misfit;
  std::string unreadable;
  std::optional<core::ErrorKind> unreadable_kind;
  std::optional<std::string> misfit_config;  // set when the misfit is another model's layout
  try {
    state = load_one(step, layout, slices);
  } catch (const CheckpointDamaged& e) {
    damage = e.what();
  } catch (const CheckpointUnreadable& e) {
    unreadable = e.what();
    unreadable_kind = e.kind();
  } catch (const CheckpointMisfit& e) {
    misfit = e.what();
    misfit_config = e.config_text();
  } catch (const std::exception& e) {
    misfit = e.what();
  }
  if (agree(damage.empty() && misfit.empty() && unreadable.empty())) return state;
  // An intact checkpoint that does not fit this run's config: an error everywhere and no
  // fallback, and a config error since a retry with the same config would fail again.
  if (!agree(misfit.empty())) {
    if (misfit_config) throw CheckpointMisfit("checkpoint load: " + misfit, *misfit_config);
    throw core::ConfigError(
        "checkpoint load: " +
        (misfit.empty() ? dir + " does not fit this run (see another rank)" : misfit));
  }
  // A file the machine failed to read: no fallback, which would train over this checkpoint.
  if (!agree(unreadable.empty())) {
    throw CheckpointUnreadable(
        "checkpoint load: " +
            (unreadable.empty() ? dir + " could not be read on another rank" : unreadable) +
            "; not falling back to an older checkpoint, which the run would train over: run again "
            "once the file can be read, or move " +
            dir + " aside to resume from the one before",
        agreed_kind(unreadable_kind));
  }
  return std::nullopt;
}

std::optional<CheckpointState> Checkpointer::load_latest(const std::vector<ParameterLayout>& layout,
                                                         const std::vector<BufferSlice>& slices) {
  // A checkpoint that is gone once its load failed was removed while it was read (`mantissa
  // export` or `sample` beside a run that saves and prunes, checkpoint.keep): no damage. The
  // directory is listed again, a few times at most.
  constexpr int kListings = 4;
  for (int listing = 1;; ++listing) {
    const std::vector<int64_t> found = agreed_steps();
    if (found.empty()) return std::nullopt;
    bool removed = false;
    for (size_t i = 0; i < found.size(); ++i) {
      const std::string dir = options_.dir + "/" + checkpoint_dir_name(found[i]);
      std::string damage;
      if (std::optional<CheckpointState> state = load_agreed(found[i], layout, slices, damage)) {
        return state;
      }
      std::error_code ec;
      if (listing < kListings && !agree(fs::exists(dir, ec))) {
        if (group_.rank == 0) {
          warn(group_.rank, "checkpoint " + dir +
                                " was removed while it was read (by a run that saves and prunes "
                                "checkpoints there?); looking again");
        }
        removed = true;
        break;
      }
      damaged_steps_.insert(found[i]);
      const std::string next = i + 1 < found.size()
                                   ? "falling back to " + checkpoint_dir_name(found[i + 1])
                                   : "no older checkpoint left";
      if (!damage.empty()) {
        warn(group_.rank, "checkpoint " + dir + " is damaged, not loaded: " + damage + "; " + next);
      } else if (group_.rank == 0) {
        warn(group_.rank, "checkpoint " + dir + " is damaged on another rank, not loaded; " + next);
      }
    }
    if (!removed) {
      throw core::Error("checkpoint load: no intact checkpoint in " + options_.dir + ": " +
                        std::to_string(found.size()) + " found, each damaged (see above)");
    }
  }
}

std::optional<CheckpointState> Checkpointer::load_step(int64_t step,
                                                       const std::vector<ParameterLayout>& layout,
                                                       const std::vector<BufferSlice>& slices) {
  const std::vector<int64_t> found = agreed_steps();
  if (std::find(found.begin(), found.end(), step) == found.end()) return std::nullopt;
  const std::string dir = options_.dir + "/" + checkpoint_dir_name(step);
  std::string damage;
  if (std::optional<CheckpointState> state = load_agreed(step, layout, slices, damage)) {
    return state;
  }
  throw CheckpointDamaged("checkpoint " + dir + " is damaged, not loaded: " +
                          (damage.empty() ? "damaged on another rank" : damage));
}

}  // namespace mantissa::checkpoint
