// The built-in synthetic corpus: byte-level text (vocab 256) with structure that a small GPT
// learns within a few hundred steps, for demos, tests and precision comparisons without any
// data files.
//
// The corpus is a sequence of lines, each ending in '\n', of four kinds chosen uniformly:
//   sentence  "<det> [<adj>] <noun> <verb> <det> [<adj>] <noun>."  from small fixed word lists
//             (each adjective present with probability 1/2), e.g. "the red fox chases a cat."
//   copy      "copy <w> <w>": the same random lowercase word of 3..8 letters twice, so the
//             second half is predictable only by looking back (what induction heads learn)
//   sum       "<a>+<b>=<a+b>" with a, b uniform in [0, 99]
//   count     "count <n> <n+1> <n+2> <n+3> <n+4>" with n uniform in [0, 95]
// The generator is a counter-based hash of the seed (core::mix64), so the same seed gives the
// same bytes on every machine, rank and standard library.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace mantissa::train {

// The word lists of the sentence lines.
inline constexpr std::string_view kSyntheticDeterminers[] = {"the", "a"};
inline constexpr std::string_view kSyntheticAdjectives[] = {"small", "big",  "red", "green",
                                                            "quick", "lazy", "old", "young"};
inline constexpr std::string_view kSyntheticNouns[] = {"cat",   "dog",   "bird", "fox",
                                                       "horse", "mouse", "fish", "frog"};
inline constexpr std::string_view kSyntheticVerbs[] = {"sees",  "chases",  "likes",
                                                       "finds", "follows", "helps"};

// The first n_tokens bytes of the corpus for `seed` (the last line is cut where it falls).
std::vector<uint16_t> synthetic_tokens(uint64_t seed, int64_t n_tokens);

}  // namespace mantissa::train
