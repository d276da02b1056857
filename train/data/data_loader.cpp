#include "train/data/data_loader.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "core/dtype/dtype.h"
#include "core/error.h"

namespace mantissa::train {

namespace {

// Keeps the window sampler's random stream apart from the synthetic generator's, which may be
// seeded with the same run seed.
constexpr uint64_t kStreamTag = 0x77696e646f777321ULL;  // "windows!"

// A keyed permutation of [0, n) that needs no table: an eight-round Feistel network over the
// smallest domain of 2^(2h) >= n values (a bijection for any round function), applied again to
// any value >= n until one lands below n ("cycle walking": the walk stays on i's cycle, which
// holds a value below n, so the map restricted to [0, n) is a bijection too). The domain is
// under 4n, so a walk takes fewer than 4 passes of the network on average. Eight rounds, each
// with its own key: the place a window takes in an epoch is uniform (test_data's chi-squared
// test), where four rounds with their own keys placed it unevenly in epochs of a few windows,
// and four sharing one function in epochs of up to a thousand. Whole orders of an epoch of a few
// windows are not quite (a Feistel network over 4^h values, h >= 2, makes only even permutations),
// which no training run would notice.
int64_t permuted(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  const int half_bits = (std::bit_width(static_cast<uint64_t>(n - 1)) + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  auto x = static_cast<uint64_t>(i);
  do {
    uint64_t left = x >> half_bits, right = x & mask;
    for (uint64_t round = 0; round < 8; ++round) {
      const uint64_t round_key = core::mix64(key + round * 0x9e3779b97f4a7c15ULL);
      const uint64_t mixed = left ^ (core::mix64(round_key ^ right) & mask);
      left = right;
      right = mixed;
    }
    x = (left << half_bits) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Corpus> corpus, const DataLoaderConfig& config)
    : corpus_(std::move(corpus)),
      config_(config),
      stream_seed_(core::mix64(config.seed ^ kStreamTag)) {
  MANTISSA_CHECK(corpus_ != nullptr, "data loader: no corpus");
  MANTISSA_CHECK(config.seq_len >= 1, "data loader: seq_len must be >= 1, got " << config.seq_len);
  MANTISSA_CHECK(config.micro_batch >= 1,
                 "data loader: micro_batch_size must be >= 1, got " << config.micro_batch);
  MANTISSA_CHECK(
      config.world_size >= 1 && config.rank >= 0 && config.rank < config.world_size,
      "data loader: rank " << config.rank << " outside world of size " << config.world_size);
  const int64_t T = config.seq_len;
  int64_t total = 0;
  int64_t longest = 0;
  for (const TokenSegment& segment : corpus_->segments()) {
    const int64_t n = segment.size();
    longest = std::max(longest, n);
    // Windows [jT, jT + T] with jT + T + 1 <= n (epochs), or starts s with s + T + 1 <= n.
    const int64_t end_to_end = std::max<int64_t>(n - 1, 0) / T;
    windows_per_epoch_ += end_to_end;
    total += config.sampling == WindowSampling::kEpochs ? end_to_end : std::max<int64_t>(n - T, 0);
    slots_end_.push_back(total);
  }
  if (total == 0) {
    throw TrainingDataTooShort("data '" + corpus_->name() + "': no segment holds seq_len + 1 = " +
                                   std::to_string(config.seq_len + 1) +
                                   " tokens (the longest has " + std::to_string(longest) + ")",
                               longest);
  }
}

std::vector<std::string> DataLoader::unread_segments() const {
  std::vector<std::string> unread;
  for (const TokenSegment& segment : corpus_->segments()) {
    if (segment.size() <= config_.seq_len) {
      unread.push_back(segment.name() + " (" + std::to_string(segment.size()) + " tokens)");
    }
  }
  return unread;
}

void DataLoader::read_window(int64_t k, std::span<int32_t> out) const {
  MANTISSA_CHECK(k >= 0, "data loader: window index must be >= 0, got " << k);
  MANTISSA_CHECK(static_cast<int64_t>(out.size()) == config_.seq_len + 1,
                 "data loader: window buffer holds " << out.size() << " tokens, expected "
                                                     << config_.seq_len + 1);
  const int64_t slot = slot_of(k);
  const auto segment_end = std::upper_bound(slots_end_.begin(), slots_end_.end(), slot);
  const size_t segment = static_cast<size_t>(segment_end - slots_end_.begin());
  const int64_t in_segment = slot - (segment == 0 ? 0 : slots_end_[segment - 1]);
  const int64_t start =
      config_.sampling == WindowSampling::kEpochs ? in_segment * config_.seq_len : in_segment;
  corpus_->segments()[segment].read(start, out, corpus_->vocab_size());
}

int64_t DataLoader::slot_of(int64_t k) const {
  const int64_t slots = slots_end_.back();
  if (config_.sampling == WindowSampling::kRandom) {
    // A 64-bit draw makes the modulo bias negligible for any corpus size.
    const uint64_t draw = core::mix64(stream_seed_ ^ core::mix64(static_cast<uint64_t>(k)));
    return static_cast<int64_t>(draw % static_cast<uint64_t>(slots));
  }
  const int64_t since_origin = k - cursor_.epoch_origin;
  MANTISSA_CHECK(since_origin >= 0, "data loader: window " << k << " lies before the epoch origin "
                                                           << cursor_.epoch_origin);
  const int64_t epoch = since_origin / slots;
  return permuted(since_origin % slots, slots,
                  core::mix64(stream_seed_ ^ static_cast<uint64_t>(epoch)));
}

Batch DataLoader::next() {
  const int64_t B = config_.micro_batch;
  const int64_t T = config_.seq_len;
  Batch batch{B, T, std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  std::vector<int32_t> window(T + 1);
  const int64_t first = cursor_.next_window + config_.rank * B;
  for (int64_t b = 0; b < B; ++b) {
    read_window(first + b, window);
    std::copy(window.begin(), window.end() - 1, batch.tokens.begin() + b * T);
    std::copy(window.begin() + 1, window.end(), batch.targets.begin() + b * T);
  }
  cursor_.next_window += config_.world_size * B;
  return batch;
}

void DataLoader::set_cursor(const DataCursor& cursor) {
  MANTISSA_CHECK(cursor.next_window >= 0,
                 "data cursor: next_window must be >= 0, got " << cursor.next_window);
  MANTISSA_CHECK(cursor.epoch_origin >= 0 && cursor.epoch_origin <= cursor.next_window,
                 "data cursor: epoch_origin " << cursor.epoch_origin << " outside [0, "
                                              << cursor.next_window << "]");
  cursor_ = cursor;
}

}  // namespace mantissa::train
