// The checkpoint manifest on its own: sealing messages with a CRC32C trailer, converting
// between CheckpointState and the TrainState message, and validating a manifest's tensor
// index before any of it is trusted. checkpoint/checkpoint.cpp builds saves and loads on these;
// the manifest fuzzer and the tests call them directly.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.pb.h"  // generated from proto/checkpoint.proto
#include "checkpoint/checkpoint.h"
#include "core/error.h"

namespace mantissa::checkpoint {

// A checkpoint (or one file of it) that cannot be trusted: a file missing or truncated, a
// checksum mismatch, an index that contradicts itself. A load reports it and falls back to the
// previous checkpoint. Other core::Errors (an intact checkpoint that does not fit the run) do not
// fall back.
class CheckpointDamaged : public core::Error {
 public:
  using core::Error::Error;
};

// A checkpoint file that could not be read for a reason outside its content (an I/O error, a
// stale network file handle, no file descriptors left, no permission). A load stops rather
// than fall back to an older checkpoint, which the run would then train over, replacing the
// unread one at its step. Its kind is core::path_error_kind's: 1 where a retry may read it,
// 2 where the user must change something (permissions).
class CheckpointUnreadable : public core::Error {
 public:
  CheckpointUnreadable(const std::string& message, core::ErrorKind kind)
      : core::Error(message), kind_(kind) {}
  core::ErrorKind kind() const override { return kind_; }

 private:
  core::ErrorKind kind_;
};

// The serialized message followed by its CRC32C as field 15 (fixed32), see
// proto/checkpoint.proto. The message's own field 15 must be unset.
std::string seal_message(const google::protobuf::MessageLite& message);
// Checks the trailer against the bytes and parses them into `message`; throws
// CheckpointDamaged naming `path` when anything is off.
void unseal_message(std::string_view bytes, google::protobuf::MessageLite& message,
                    const std::string& path);

TrainState state_to_proto(const CheckpointState& state);

// A verified manifest: the state, and the index entries grouped by buffer name in element
// order (each buffer's entries tile [0, its size) exactly).
struct Manifest {
  CheckpointState state;
  std::vector<std::vector<TensorEntry>> buffers;
};

// Unseals, parses and validates manifest bytes read from `path`. Throws CheckpointDamaged when
// the bytes cannot be trusted or the index contradicts itself, core::Error when the manifest
// is intact but of another format version.
Manifest decode_manifest(std::string_view bytes, const std::string& path);

// The payload files the index names, each with the size the index implies.
std::vector<std::pair<std::string, uint64_t>> payload_files(const Manifest& manifest);

// Checks one entry for the rules decode_manifest enforces on each (shape, ranges, sizes, file
// name); throws CheckpointDamaged naming `path` and the entry.
void validate_entry(const TensorEntry& entry, const std::string& path);

TensorDType to_proto_dtype(core::DType dtype);
core::DType from_proto_dtype(TensorDType dtype, const std::string& what);

// "rank_00003.bin".
std::string payload_file_name(int rank);

}  // namespace mantissa::checkpoint
