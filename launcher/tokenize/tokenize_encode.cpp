#include "launcher/tokenize/tokenize_encode.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "core/config_check.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "launcher/tokenize/tokenize_input.h"
#include "launcher/tokenize/tokenize_model.h"
#include "launcher/tokenize/tokenize_shards.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

namespace {

// The threads take chunks of about kChunkBytes of text, each ending after a newline (within a
// line longer than kChunkBytes, at a character boundary), and encode each in pieces of about
// kPieceBytes that end after a newline. Where chunks and pieces end depends on the text alone,
// so the tokens do not depend on how many threads encode them. SentencePiece's BPE slows down
// on long inputs (0.9 MB/s a thread for 1 MB, 3.5 MB/s for 4 kB pieces); a piece boundary
// changes the tokens only where a piece spanning it would have been chosen (a newline then
// text), about 1 token in 10^4 more.
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kPieceBytes = 4096;
// Shard names carry six digits, so that the glob's sorted order is the stream's order.
constexpr size_t kMaxShards = 1'000'000;
constexpr auto kProgressInterval = std::chrono::seconds(5);

struct Chunk {
  size_t file;
  size_t begin;
  size_t end;
};

// The end of the chunk of `text` that starts at `begin`.
size_t chunk_end(std::string_view text, size_t begin) {
  if (text.size() - begin <= kChunkBytes) return text.size();
  const size_t newline = text.find('\n', begin + kChunkBytes - 1);
  if (newline != std::string_view::npos && newline - begin < 2 * kChunkBytes) return newline + 1;
  // Back to the first byte of a character (at most 3 continuation bytes in valid text).
  size_t end = begin + kChunkBytes;
  for (int k = 0; k < 3 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80; ++k) --end;
  return end;
}

std::vector<Chunk> plan_chunks(const std::vector<MappedText>& files) {
  std::vector<Chunk> chunks;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string_view text = files[f].text();
    for (size_t begin = 0; begin < text.size();) {
      const size_t end = chunk_end(text, begin);
      chunks.push_back({f, begin, end});
      begin = end;
    }
  }
  return chunks;
}

void encode_in_pieces(const Tokenizer& tokenizer, std::string_view text,
                      std::vector<uint32_t>& out) {
  while (!text.empty()) {
    const size_t newline = text.find('\n', kPieceBytes - 1);
    const size_t end = newline == std::string_view::npos ? text.size() : newline + 1;
    tokenizer.encode(text.substr(0, end), out);
    text.remove_prefix(end);
  }
}

// Encodes every chunk on `threads` threads and hands each chunk's tokens to `consume(chunk,
// tokens)` on the calling thread, in chunk order, as soon as the chunks before it are done.
// The threads stay at most 4 chunks each ahead of `consume`, so that memory holds a few chunks'
// tokens, not the stream's.
template <typename Consume>
void encode_chunks(const Tokenizer& tokenizer, const std::vector<MappedText>& files,
                   const std::vector<Chunk>& chunks, int threads, Consume&& consume) {
  const size_t chunks_ahead = static_cast<size_t>(4 * threads);
  const size_t bytes_in_all = total_bytes(files);

  // All under `mutex`: the chunks encoded and waiting, the next one to take and to consume.
  std::vector<bool> encoded(chunks.size(), false);
  std::vector<std::vector<uint32_t>> results(chunks.size());
  size_t next = 0;
  size_t consumed = 0;
  size_t bytes_done = 0;
  size_t tokens_done = 0;
  int running = threads;
  std::exception_ptr failure;
  std::mutex mutex;
  std::condition_variable changed;

  auto work = [&] {
    std::unique_lock lock(mutex);
    while (true) {
      changed.wait(
          lock, [&] { return failure || next == chunks.size() || next < consumed + chunks_ahead; });
      if (failure || next == chunks.size()) break;
      const size_t i = next++;
      lock.unlock();
      const Chunk& c = chunks[i];
      const std::string_view text = files[c.file].text().substr(c.begin, c.end - c.begin);
      std::vector<uint32_t> tokens;
      std::exception_ptr error;
      try {
        encode_in_pieces(tokenizer, text, tokens);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error) {
        if (!failure) failure = error;
      } else {
        encoded[i] = true;
        results[i] = std::move(tokens);
        bytes_done += text.size();
      }
      changed.notify_all();
    }
    --running;
    changed.notify_all();
  };

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  {
    std::unique_lock lock(mutex);
    auto last_report = std::chrono::steady_clock::now();
    while (!failure) {
      try {
        core::throw_if_interrupted();
      } catch (const core::Interrupted&) {
        failure = std::current_exception();
        break;
      }
      if (consumed < chunks.size() && encoded[consumed]) {
        const std::vector<uint32_t> tokens = std::move(results[consumed]);
        lock.unlock();
        try {
          consume(consumed, tokens);
        } catch (...) {
          lock.lock();
          failure = std::current_exception();
          break;
        }
        lock.lock();
        tokens_done += tokens.size();
        ++consumed;
        changed.notify_all();
        continue;
      }
      if (running == 0) break;
      changed.wait_for(lock, kProgressInterval);
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report >= kProgressInterval) {
        last_report = now;
        const double seconds = std::chrono::duration<double>(now - start).count();
        std::fprintf(stderr, "mantissa: encoded %s of %s (%.0f%%), %s/s, %zu tokens\n",
                     format_bytes(bytes_done).c_str(), format_bytes(bytes_in_all).c_str(),
                     100.0 * bytes_done / bytes_in_all, format_bytes(bytes_done / seconds).c_str(),
                     tokens_done);
      }
    }
    changed.notify_all();
  }
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

std::string shard_name(const char* split, size_t index) {
  char name[32];
  std::snprintf(name, sizeof name, "%s_%06zu.bin", split, index);
  return name;
}

// Writes `tokens` as shards `split`_000000.bin, ...; returns how many.
size_t write_split(StagedOutput& out, const Tokenizer& tokenizer, const char* split,
                   const train::TokenSegment& tokens, int64_t shard_tokens) {
  const std::vector<std::pair<int64_t, int64_t>> shards =
      plan_shards(tokenizer, tokens, shard_tokens);
  if (shards.size() > kMaxShards) {
    throw core::ConfigError("--shard-tokens " + std::to_string(shard_tokens) + " makes " +
                            std::to_string(shards.size()) + " " + split + " shards, more than " +
                            std::to_string(kMaxShards) + " (six-digit names)");
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    core::throw_if_interrupted();
    const auto [begin, end] = shards[s];
    out.write_shard(shard_name(split, s), tokens.subspan(begin, end - begin));
  }
  return shards.size();
}

}  // namespace

void encode_as_shards(const Tokenizer& tokenizer, std::string_view text,
                      std::vector<uint32_t>& out) {
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = chunk_end(text, begin);
    encode_in_pieces(tokenizer, text.substr(begin, end - begin), out);
    begin = end;
  }
}

void encode_to_shards(const EncodeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    throw core::ConfigError("--val-fraction " + core::format_number(options.val_fraction) +
                            ": must lie in [0, 1)");
  }
  if (options.shard_tokens < 4 || options.shard_tokens > INT32_MAX) {
    throw core::ConfigError("--shard-tokens " + std::to_string(options.shard_tokens) +
                            ": must lie in [4, 2147483647] (the header's int32 count; a "
                            "character's up to 4 byte tokens stay in one shard)");
  }
  const Tokenizer tokenizer(options.tokenizer);
  core::InterruptWatch interrupt;
  // The output first (a directory holding shards, or one where no file can be created, is
  // refused at once), then the inputs, all read before any is encoded.
  StagedOutput out(options.out_dir, options.force);
  // One stream, in the shards' width: each file is a document, and llm.c puts the end-of-text
  // token before each.
  TokenSpill spill(out.dir(), train::shard_token_bytes(tokenizer.vocab_size()));
  const std::vector<MappedText> files = map_utf8_inputs(options.inputs, out.replaced_files());
  const std::vector<Chunk> chunks = plan_chunks(files);
  const int threads = static_cast<int>(std::min<size_t>(usable_cores(), chunks.size()));
  const uint32_t eot = tokenizer.eot();
  encode_chunks(tokenizer, files, chunks, threads,
                [&](size_t chunk, const std::vector<uint32_t>& tokens) {
                  const Chunk& c = chunks[chunk];
                  if (c.begin == 0) spill.append(std::span(&eot, 1));
                  spill.append(tokens);
                  // The file's last chunk: it has been read for the last time.
                  if (c.end == files[c.file].text().size()) require_unchanged_input(files[c.file]);
                });
  const train::TokenSegment stream = spill.map();
  const int64_t total = stream.size();

  // The validation split is the tail of the stream, starting where a shard may start.
  int64_t cut = total;
  if (options.val_fraction > 0) {
    const int64_t held_out =
        std::max<int64_t>(1, std::llround(options.val_fraction * static_cast<double>(total)));
    cut = held_out >= total ? 0 : start_at_or_before(tokenizer, stream, total - held_out);
    if (cut == 0) {
      throw core::ConfigError("the input's " + std::to_string(total) +
                              " tokens are too few to hold out --val-fraction " +
                              core::format_number(options.val_fraction) + " of them");
    }
  }
  const size_t train_shards =
      write_split(out, tokenizer, "train", stream.subspan(0, cut), options.shard_tokens);
  const size_t val_shards =
      write_split(out, tokenizer, "val", stream.subspan(cut, total - cut), options.shard_tokens);
  out.write_file(train::kShardsTokenizerFile, tokenizer.model_bytes());
  interrupt.run_uninterrupted([&] { out.commit(); });

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "mantissa: wrote %s: %lld tokens (train %lld in %zu shard%s, val %lld in %zu) "
               "from %s of text in %.1f s on %d thread%s; vocab %d, end of text %u\n",
               out.dir().c_str(), static_cast<long long>(total), static_cast<long long>(cut),
               train_shards, train_shards == 1 ? "" : "s", static_cast<long long>(total - cut),
               val_shards, format_bytes(total_bytes(files)).c_str(), seconds, threads,
               threads == 1 ? "" : "s", tokenizer.vocab_size(), eot);
  // A signal held back while the files moved into place: the run still ends by it.
  core::throw_if_interrupted("after the encode finished (its output is complete)");
}

}  // namespace mantissa::launcher
