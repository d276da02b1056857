// Fuzz target: the llm.c token shard loader (train::Corpus::token_shards) and the data loader
// on top of it.
//
// Input: byte 0 picks the vocabulary size (1..256 scaled to 1..65536), the rest is the shard
// file. A shard that loads is then sampled by a DataLoader when it holds a window, and every
// token handed out must lie below the vocabulary size. Rejections must be core::Error.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "core/error.h"
#include "tests/fuzz/process_scratch.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  if (size < 1) return 0;
  const int vocab_size = (data[0] + 1) * 256;
  static const fuzz::ProcessScratch scratch("mantissa_fuzz_shard", ".bin");
  const std::string& path = scratch.path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  try {
    auto corpus =
        std::make_shared<const train::Corpus>(train::Corpus::token_shards(path, vocab_size));
    train::DataLoader loader(
        corpus, {.seq_len = 4, .micro_batch = 2, .world_size = 2, .rank = 1, .seed = 3});
    for (int step = 0; step < 3; ++step) {
      const train::Batch batch = loader.next();
      for (size_t i = 0; i < batch.tokens.size(); ++i)
        if (batch.tokens[i] < 0 || batch.tokens[i] >= vocab_size || batch.targets[i] < 0 ||
            batch.targets[i] >= vocab_size)
          __builtin_trap();
    }
  } catch (const core::Error&) {
  }
  return 0;
}
