#include "checkpoint/checkpoint_manifest.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "checkpoint/crc32c.h"

// Throws CheckpointDamaged with a message built with stream syntax.
#define CHECK_INTACT(condition, message_stream)      \
  do {                                               \
    if (!(condition)) {                              \
      std::ostringstream intact_message;             \
      intact_message << message_stream;              \
      throw CheckpointDamaged(intact_message.str()); \
    }                                                \
  } while (0)

namespace mantissa::checkpoint {
namespace {

// The trailer: field 15, wire type 5 (fixed32) is the single tag byte (15 << 3) | 5, then the
// CRC32C in 4 little-endian bytes.
constexpr unsigned char kTrailerTag = (15 << 3) | 5;
constexpr size_t kTrailerBytes = 5;

// Bounds that keep every size computation below far from int64 overflow, whatever a manifest
// says: no buffer or file of ours approaches 2^60 bytes.
constexpr int64_t kMaxElements = int64_t{1} << 58;
constexpr uint64_t kMaxBytes = uint64_t{1} << 60;

// The element count of `dims`, or -1 when a dimension is negative or the product is too big.
int64_t checked_numel(const google::protobuf::RepeatedField<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements) return -1;
  }
  return n;
}

}  // namespace

std::string payload_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.bin", rank);
  return name;
}

TensorDType to_proto_dtype(core::DType dtype) {
  switch (dtype) {
    case core::DType::kF32: return F32;
    case core::DType::kBF16: return BF16;
    case core::DType::kF16: return F16;
    case core::DType::kE4M3: return E4M3;
    case core::DType::kE5M2: return E5M2;
    case core::DType::kI32: return I32;
    case core::DType::kI64: return I64;
    case core::DType::kU8: return U8;
  }
  MANTISSA_FAIL("checkpoint: unknown dtype " << static_cast<int>(dtype));
}

core::DType from_proto_dtype(TensorDType dtype, const std::string& what) {
  switch (dtype) {
    case F32: return core::DType::kF32;
    case BF16: return core::DType::kBF16;
    case F16: return core::DType::kF16;
    case E4M3: return core::DType::kE4M3;
    case E5M2: return core::DType::kE5M2;
    case I32: return core::DType::kI32;
    case I64: return core::DType::kI64;
    case U8: return core::DType::kU8;
    default: break;
  }
  throw CheckpointDamaged(what + ": invalid dtype " + std::to_string(static_cast<int>(dtype)));
}

std::string seal_message(const google::protobuf::MessageLite& message) {
  std::string bytes = message.SerializeAsString();
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  bytes.push_back(static_cast<char>(kTrailerTag));
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  return bytes;
}

void unseal_message(std::string_view bytes, google::protobuf::MessageLite& message,
                    const std::string& path) {
  CHECK_INTACT(bytes.size() >= kTrailerBytes,
               path << ": truncated (" << bytes.size() << " bytes, no CRC32C trailer)");
  const size_t body = bytes.size() - kTrailerBytes;
  CHECK_INTACT(static_cast<unsigned char>(bytes[body]) == kTrailerTag,
               path << ": no CRC32C trailer at the end (truncated or corrupt)");
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i)
    stored |= uint32_t{static_cast<unsigned char>(bytes[body + 1 + i])} << (8 * i);
  const uint32_t computed = crc32c(bytes.data(), body);
  if (computed != stored) {
    char hex[64];
    std::snprintf(hex, sizeof hex, "stored 0x%08x, computed 0x%08x", stored, computed);
    CHECK_INTACT(false, path << ": CRC32C mismatch (" << hex << ")");
  }
  CHECK_INTACT(message.ParseFromArray(bytes.data(), static_cast<int>(body)),
               path << ": not a valid " << message.GetTypeName() << " message");
}

TrainState state_to_proto(const CheckpointState& state) {
  TrainState p;
  p.set_format_version(kCheckpointFormatVersion);
  p.set_step(state.step);
  p.set_tokens(state.tokens);
  p.set_optimizer_steps(state.optimizer_steps);
  p.set_seed(state.seed);
  p.set_world_size(state.world_size);
  p.set_zero_stage(state.zero_stage);
  LossScalerState& s = *p.mutable_loss_scaler();
  s.set_scale(state.loss_scaler.scale);
  s.set_growth_tracker(state.loss_scaler.growth_tracker);
  s.set_hysteresis_tracker(state.loss_scaler.hysteresis_tracker);
  s.set_overflows_at_min(state.loss_scaler.overflows_at_min);
  s.set_overflow_steps_total(state.loss_scaler.overflow_steps_total);
  s.set_dynamic(state.loss_scaler.dynamic);
  for (const core::Fp8TensorState& t : state.fp8.tensors) {
    Fp8TensorState& f = *p.add_fp8();
    f.set_name(t.name);
    f.set_format(to_proto_dtype(t.format));
    f.mutable_amax_history()->Add(t.amax_history.begin(), t.amax_history.end());
    f.set_history_next(t.history_next);
    f.set_scale(t.scale);
    f.set_scale_inv(t.scale_inv);
  }
  if (!state.fp8.tensors.empty()) p.set_fp8_recipe(state.fp8.recipe);
  p.set_data_next_window(state.data.next_window);
  p.set_data_epoch_origin(state.data.epoch_origin);
  p.set_data_fingerprint(state.data_fingerprint);
  p.set_tokenizer_crc32c(state.tokenizer_crc32c);
  p.set_config_text(state.config_text);
  p.set_written_by(state.written_by);
  p.set_saved_unix_time(state.saved_unix_time);
  if (state.last_val_loss) p.set_last_val_loss(*state.last_val_loss);
  p.set_val_loss_rises(state.val_loss_rises);
  p.set_validation_key(state.validation_key);
  for (const ParameterLayout& layout : state.parameters) {
    mantissa::ParameterLayout& l = *p.add_parameters();
    l.set_name(layout.name);
    l.mutable_shape()->Add(layout.shape.dims().begin(), layout.shape.dims().end());
    l.set_offset(layout.offset);
  }
  return p;
}

void validate_entry(const TensorEntry& e, const std::string& path) {
  const std::string what = path + ": tensor entry '" + e.name() + "'";
  CHECK_INTACT(!e.name().empty(), path << ": tensor entry without a name");
  const size_t element_size = core::dtype_size(from_proto_dtype(e.dtype(), what));
  CHECK_INTACT(e.shape_size() == 1 && checked_numel(e.shape()) >= 0,
               what << ": shape must be [elements] with 0 <= elements <= 2^58");
  const int64_t numel = e.shape(0);
  CHECK_INTACT(e.element_begin() >= 0 && e.element_count() >= 0 &&
                   e.element_begin() <= numel - e.element_count(),
               what << ": " << e.element_count() << " elements from " << e.element_begin()
                    << " lie outside the buffer's " << numel);
  CHECK_INTACT(e.byte_length() == static_cast<uint64_t>(e.element_count()) * element_size,
               what << ": byte_length " << e.byte_length() << " is not " << e.element_count()
                    << " elements of " << element_size << " bytes");
  CHECK_INTACT(e.byte_offset() <= kMaxBytes,
               what << ": byte_offset " << e.byte_offset() << " out of range");
  // Only our own file names: an index must never point outside the checkpoint directory.
  const std::string& f = e.file();
  const bool plain_name =
      f.size() == 14 && f.starts_with("rank_") && f.ends_with(".bin") &&
      std::all_of(f.begin() + 5, f.begin() + 10, [](char c) { return c >= '0' && c <= '9'; });
  CHECK_INTACT(plain_name, what << ": file '" << f << "' is not a payload file name");
}

Manifest decode_manifest(std::string_view bytes, const std::string& path) {
  TrainState p;
  unseal_message(bytes, p, path);
  MANTISSA_REQUIRE(p.format_version() == kCheckpointFormatVersion, kConfig,
                   path << ": checkpoint format version " << p.format_version()
                        << ", this build reads version " << kCheckpointFormatVersion);
  CHECK_INTACT(
      p.step() >= 0 && p.tokens() >= 0 && p.optimizer_steps() >= 0 && p.data_next_window() >= 0,
      path << ": negative counter (step, tokens, optimizer_steps or data cursor)");
  CHECK_INTACT(p.data_epoch_origin() >= 0 && p.data_epoch_origin() <= p.data_next_window(),
               path << ": data epoch origin " << p.data_epoch_origin() << " outside [0, "
                    << p.data_next_window() << "]");
  CHECK_INTACT(p.world_size() >= 1 && p.world_size() <= 99999,
               path << ": world_size " << p.world_size() << " out of range");
  CHECK_INTACT(p.zero_stage() == 0 || p.zero_stage() == 1,
               path << ": zero_stage " << p.zero_stage() << " is not 0 or 1");

  Manifest m;
  CheckpointState& s = m.state;
  s.step = p.step();
  s.tokens = p.tokens();
  s.optimizer_steps = p.optimizer_steps();
  s.seed = p.seed();
  s.zero_stage = p.zero_stage();
  s.world_size = p.world_size();
  s.loss_scaler.scale = p.loss_scaler().scale();
  s.loss_scaler.growth_tracker = p.loss_scaler().growth_tracker();
  s.loss_scaler.hysteresis_tracker = p.loss_scaler().hysteresis_tracker();
  s.loss_scaler.overflows_at_min = p.loss_scaler().overflows_at_min();
  s.loss_scaler.overflow_steps_total = p.loss_scaler().overflow_steps_total();
  // Older checkpoints did not say: their fixed scales were 1 (BF16, FP32) or a STATIC init,
  // and a dynamic scale of exactly 1 (the default minimum) would only restart from init.
  s.loss_scaler.dynamic =
      p.loss_scaler().has_dynamic() ? p.loss_scaler().dynamic() : p.loss_scaler().scale() != 1.0f;
  for (const Fp8TensorState& f : p.fp8()) {
    core::Fp8TensorState t;
    t.name = f.name();
    t.format = from_proto_dtype(f.format(), path + ": FP8 state '" + f.name() + "'");
    CHECK_INTACT(core::is_fp8(t.format),
                 path << ": FP8 state '" << f.name() << "' has a format that is not FP8");
    t.amax_history.assign(f.amax_history().begin(), f.amax_history().end());
    CHECK_INTACT(f.history_next() >= 0 &&
                     (f.history_next() < f.amax_history_size() || f.history_next() == 0),
                 path << ": FP8 state '" << f.name() << "': history_next " << f.history_next()
                      << " outside its history of " << f.amax_history_size());
    t.history_next = f.history_next();
    t.scale = f.scale();
    t.scale_inv = f.scale_inv();
    s.fp8.tensors.push_back(std::move(t));
  }
  s.fp8.recipe = p.fp8_recipe();
  s.data.next_window = p.data_next_window();
  s.data.epoch_origin = p.data_epoch_origin();
  s.data_fingerprint = p.data_fingerprint();
  s.tokenizer_crc32c = p.tokenizer_crc32c();
  s.config_text = p.config_text();
  s.written_by = p.written_by();
  s.saved_unix_time = p.saved_unix_time();
  if (p.has_last_val_loss()) s.last_val_loss = p.last_val_loss();
  CHECK_INTACT(p.val_loss_rises() >= 0,
               path << ": val_loss_rises " << p.val_loss_rises() << " is negative");
  s.val_loss_rises = p.val_loss_rises();
  s.validation_key = p.validation_key();
  for (const mantissa::ParameterLayout& l : p.parameters()) {
    CHECK_INTACT(checked_numel(l.shape()) >= 0 && l.offset() >= 0 && l.offset() <= kMaxElements,
                 path << ": parameter '" << l.name() << "' has an invalid shape or offset");
    s.parameters.push_back({l.name(),
                            core::Shape(std::vector<int64_t>(l.shape().begin(), l.shape().end())),
                            l.offset()});
  }

  // Every entry on its own, then each buffer's entries must tile it and each file's entries
  // must tile the file: together with the file sizes (checked on load) and the CRCs, every
  // byte of a checkpoint is accounted for.
  std::map<std::string, std::vector<TensorEntry>> by_buffer;
  std::map<std::string, std::vector<const TensorEntry*>> by_file;
  for (const TensorEntry& e : p.tensors()) {
    validate_entry(e, path);
    by_buffer[e.name()].push_back(e);
  }
  for (auto& [name, entries] : by_buffer) {
    std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
      return a.element_begin() < b.element_begin();
    });
    int64_t next = 0;
    for (const TensorEntry& e : entries) {
      CHECK_INTACT(e.dtype() == entries[0].dtype() && e.shape(0) == entries[0].shape(0),
                   path << ": buffer '" << name << "': entries disagree on dtype or size");
      CHECK_INTACT(e.element_begin() == next,
                   path << ": buffer '" << name << "': elements [" << next << ", "
                        << e.element_begin() << ") "
                        << (e.element_begin() > next ? "missing" : "stored twice"));
      next += e.element_count();
    }
    CHECK_INTACT(next == entries[0].shape(0), path << ": buffer '" << name << "': elements ["
                                                   << next << ", " << entries[0].shape(0)
                                                   << ") missing");
    for (const TensorEntry& e : entries) by_file[e.file()].push_back(&e);
  }
  for (auto& [file, entries] : by_file) {
    std::sort(entries.begin(), entries.end(), [](const TensorEntry* a, const TensorEntry* b) {
      return a->byte_offset() < b->byte_offset();
    });
    uint64_t next = 0;
    for (const TensorEntry* e : entries) {
      CHECK_INTACT(e->byte_offset() == next,
                   path << ": " << file << ": bytes [" << next << ", " << e->byte_offset() << ") "
                        << (e->byte_offset() > next ? "belong to no tensor" : "claimed twice"));
      next += e->byte_length();
    }
  }
  if (auto masters = by_buffer.find(kMastersBuffer); masters != by_buffer.end()) {
    const int64_t n = masters->second[0].shape(0);
    for (const ParameterLayout& l : s.parameters)
      CHECK_INTACT(l.offset <= n - l.shape.numel(),
                   path << ": parameter '" << l.name << "' lies outside the masters buffer");
  }
  for (auto& [name, entries] : by_buffer) m.buffers.push_back(std::move(entries));
  return m;
}

std::vector<std::pair<std::string, uint64_t>> payload_files(const Manifest& manifest) {
  std::map<std::string, uint64_t> sizes;
  for (const auto& entries : manifest.buffers)
    for (const TensorEntry& e : entries) sizes[e.file()] += e.byte_length();
  return {sizes.begin(), sizes.end()};
}

}  // namespace mantissa::checkpoint
