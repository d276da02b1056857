// mantissa-tokenize: `mantissa tokenize train|encode|decode` and, for `mantissa sample`,
// `info|ids|text`, in an executable of its own (launcher/tokenize/tokenize.h says why). Parses the
// command line and maps errors to exit codes.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/read_file.h"
#include "launcher/config/option_value.h"
#include "launcher/exit_codes.h"
#include "launcher/tokenize/tokenize_decode.h"
#include "launcher/tokenize/tokenize_encode.h"
#include "launcher/tokenize/tokenize_ids.h"
#include "launcher/tokenize/tokenize_model.h"
#include "launcher/tokenize/tokenize_train.h"

namespace mantissa::launcher {
namespace {

constexpr const char* kHelp =
    R"(usage: mantissa tokenize train  --input FILE... --vocab-size N --out TOK.model
                                [--model-type bpe|unigram] [--sample-bytes N] [--force]
       mantissa tokenize encode --tokenizer TOK.model --input FILE... --out-dir DIR
                                [--val-fraction F] [--shard-tokens N] [--force]
       mantissa tokenize decode --tokenizer TOK.model --input SHARD...
       mantissa tokenize info|ids|text --tokenizer TOK.model
       (train, encode and decode take --input-list LIST as well as, or instead of, --input)

Turns UTF-8 text into llm.c token shards for data.token_shards, and back, with a SentencePiece
tokenizer whose decoding is exact: decode(encode(text)) is the text, byte for byte, for any
valid UTF-8.

train   trains a tokenizer on the files and writes it to --out (SentencePiece's model format,
        which its Python package also reads). Decoding is exact because nothing is normalised
        (identity rule, spaces kept as they are, no space added in front) and a character
        outside the vocabulary becomes its UTF-8 bytes (byte fallback). Ids: 0 <unk>, 1 <s>,
        2 </s> (end of text), 3..258 the bytes 0x00..0xFF, then the learned pieces. Training
        reads the text in blocks of whole lines of up to 4096 bytes (newlines included, so
        pieces such as "\n\n" are learned) and holds what it reads in memory, several times
        over: past --sample-bytes, it reads blocks spread evenly over the inputs, with gaps
        between them, the same blocks on every run. SentencePiece trains on 16 threads
        whatever the cores, so the model is the same on every machine. It prints a line
        every 10 s while it reads the text and learns the pieces, and one when done (and,
        as encode does, a line when it checks more than 1 GiB of inputs for invalid UTF-8).
  --input FILE...     text files (one or more, after one --input or several; each file once,
                      under any name)
  --input-list LIST   a file naming input files, one path per line (empty lines and lines
                      beginning with # skipped: write a file named #x as ./#x; a relative
                      path taken from the current directory), for more files than a
                      command line holds (`find corpus -name '*.txt' | sort > LIST`, or a
                      pipe: --input-list <(find ...)); its files come where it stands among
                      the --input files
  --vocab-size N      pieces in the model, 260..1048576: besides the 3 special and 256 byte
                      pieces the model holds SentencePiece's space mark U+2581 and one piece
                      per other character of the text (those making up 99.95% of it), so a
                      text of many characters needs more; shards store ids as uint16 up to
                      65536 pieces, as uint32 beyond. The model's vocab_size must be at
                      least N.
  --model-type T      bpe (default, as GPT-2) or unigram (SentencePiece's default)
  --sample-bytes N    text to train on, at most N and one 4 KiB block; N at least 4096
                      (default 268435456: 256 MiB, which needs about 6 GB of memory; 20-25
                      bytes per byte of text)
  --out FILE          where the model goes

encode  encodes the files on every core (the tokens do not depend on the thread count) and
        writes DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin, numbered from 000000, and a copy
        of the tokenizer as DIR/tokenizer.model. The files form one token stream, in the order
        given; each file is one document and starts with the end-of-text token </s>, as in
        llm.c's shards. Shards follow llm.c's format: a header of 256 int32 (magic 20240520,
        version 1, token count), then the tokens as uint16, little-endian; for a tokenizer of
        more than 65536 pieces, llm.c's Llama-3 format (magic 20240801, version 7, uint32
        tokens). A character encoded as byte tokens never straddles two shards or the
        train/val cut, so every shard decodes on its own. The text is encoded in pieces of
        about 4 KiB that end after a newline, each on its own (SentencePiece slows down on
        long inputs): a token that would span a piece's end is cut in two there, so about 1
        token in 10^4 differs from encoding each file whole; decoding is exact either way.
        Progress goes to stderr every 5 s.
        Memory: a few MB per core; the files are mapped, not read in, and the token stream
        goes to a temporary file in DIR, without a name, before it is cut into shards, so DIR
        needs room for twice the shards while encode runs.
  --tokenizer FILE    a model from `mantissa tokenize train` (another SentencePiece model is
                      refused unless it gives text back exactly)
  --input FILE...     text files, as for train (--input-list LIST too)
  --out-dir DIR       created when missing
  --val-fraction F    the tail of the stream held out as val shards, in [0, 1) (default 0.1;
                      0: none)
  --shard-tokens N    tokens per shard at most, 4..2147483647 (default 100000000: 200 MB)

decode  prints the text of the shards on stdout, read in the order given as one stream;
        end-of-text tokens print nothing, so decoding DIR/train_*.bin then DIR/val_*.bin
        gives back the encoded files, concatenated. Ids that no encoding gives print as
        SentencePiece shows them (U+FFFD for byte tokens that form no character; <unk> as
        U+2047 with a space either side).
  --tokenizer FILE    the model the shards were encoded with
  --input SHARD...    shards (one or more; --input-list LIST as for train)

info    prints "vocab_size N", "eot E" (the end-of-text id) and "never_encoded I..." (the ids
        that encoded text never holds, <unk> and <s>, which sampling never draws), one per
        line.
ids     reads UTF-8 text on stdin to its end and prints its token ids on one line, decimal,
        separated by spaces: the ids encode writes for a file of that text (in the same
        pieces), without the end-of-text token before it.
text    reads token ids on stdin (decimal, separated by white space) and prints their text
        exactly (ids that no encoding gives print as decode shows them). `mantissa sample`
        uses these three, since it cannot load SentencePiece itself.
  --tokenizer FILE    the model

options of train and encode:
  --force             replace an existing --out file, or the shards and tokenizer.model in
                      --out-dir (shards of the old set that the new one does not rewrite are
                      removed: train_ or val_, 6 or more digits, .bin); never an input (exit 2)
  -h, --help          this help

Options take `--opt value` or `--opt=value`. Files are written under temporary names (.tmp)
and renamed into place when all are complete: a failure while writing leaves none of them
behind (and an old set as it was). While encode renames a set into place, the file
.mantissa-encode-unfinished marks the directory; a failure or crash then leaves it there, and
training refuses the directory until an encode with --force finishes. An input appended to,
cut short or rewritten in place while train or encode reads it (a download still running, a
`>` onto it) stops the command with exit 2, naming it, before anything is written; a rewrite
that keeps the size within the file system's time resolution is not seen.

then train on the shards:
  data { token_shards { pattern: "DIR/train_*.bin" } }
  model { gpt2 { vocab_size: N } }   (N at least the tokenizer's --vocab-size)

exit codes:
  0  done
  1  runtime failure (a full disk, an I/O error)
  2  bad command line or input: a vocab size outside 260..1048576, a sample size below
     4096, an input that is missing, unreadable, empty or not valid UTF-8 (named, with the
     byte offset), an --input-list that cannot be read or names no file, an --out or
     --out-dir that already holds a model or shards (without --force) or a train_*.bin or
     val_*.bin that encode did not write, or where no file can be created (no permission, a
     read-only file system; all found before any work, but an --out that appears while the
     model trains, left as it is), an input that --force would replace, a
     tokenizer that cannot be loaded or does not decode exactly, a shard that is malformed
     or holds an id past the vocabulary, a text SentencePiece cannot train the vocab size on,
     an input that changed while it was read
  ended by SIGINT (Ctrl-C), SIGTERM or SIGHUP (the shell shows 130, 143, 129): an encode
     stops, removes what it wrote and the directories it made, and ends by the signal (a
     second signal ends it at once, leaving hidden .NAME.tmp files that the next encode
     there clears); one that comes while the files move into place is taken after the move
)";

struct Args {
  std::string subcommand;
  bool help = false;
  std::vector<std::string> inputs;
  std::string tokenizer;
  std::string out;
  std::string out_dir;
  std::optional<int64_t> vocab_size;
  std::string model_type = "bpe";
  double val_fraction = kDefaultValFraction;
  int64_t shard_tokens = kDefaultShardTokens;
  int64_t sample_bytes = kDefaultSampleBytes;
  bool force = false;
};

const std::string kUsage = " (see mantissa tokenize --help)";
constexpr const char* kSubcommands = "train, encode, decode, info, ids or text";

int64_t parse_int(const std::string& name, const std::string& value) {
  const std::optional<int64_t> out = whole_number<int64_t>(value);
  if (!out) throw core::ConfigError(name + " takes an integer, got '" + value + "'" + kUsage);
  return *out;
}

double parse_number(const std::string& name, const std::string& value) {
  const std::optional<double> out = finite_number(value);
  if (!out) throw core::ConfigError(name + " takes a number, got '" + value + "'" + kUsage);
  return *out;
}

// info, ids and text take no --input files (ids and text read standard input).
bool takes_no_files(const std::string& subcommand) {
  return subcommand == "info" || subcommand == "ids" || subcommand == "text";
}

// The paths a --input-list file names, one per line, in its order; empty lines and comments
// (lines beginning with #, as in rsync's --files-from) are skipped.
// The list may be a pipe (`--input-list <(find corpus -name '*.txt')`): it is read once.
std::vector<std::string> read_input_list(const std::string& list) {
  std::istringstream in(core::read_whole_file(list, "--input-list", core::NamedPipe::kReadOnce));
  std::vector<std::string> paths;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && !line.starts_with('#')) paths.push_back(line);
  }
  if (paths.empty()) throw core::ConfigError("--input-list '" + list + "' names no file");
  return paths;
}

bool allowed(const std::string& subcommand, const std::string& name) {
  if (name == "--input" || name == "--input-list") return !takes_no_files(subcommand);
  if (subcommand == "train") {
    return name == "--vocab-size" || name == "--out" || name == "--model-type" ||
           name == "--sample-bytes" || name == "--force";
  }
  if (subcommand == "encode") {
    return name == "--tokenizer" || name == "--out-dir" || name == "--val-fraction" ||
           name == "--shard-tokens" || name == "--force";
  }
  return name == "--tokenizer";
}

void require(bool present, const std::string& what, const Args& args) {
  if (!present) {
    throw core::ConfigError("tokenize " + args.subcommand + " needs " + what + kUsage);
  }
}

Args parse(const std::vector<std::string>& argv) {
  Args args;
  // Help where an option stands, not as an option's value nor as one of --input's files.
  for (size_t i = 0; i < argv.size() && !args.help; ++i) {
    const std::string& arg = argv[i];
    args.help = arg == "-h" || arg == "--help";
    if (!arg.starts_with("--") || arg.find('=') != std::string::npos || arg == "--force") continue;
    // Its files (--input), or its value as option_value takes it.
    while (i + 1 < argv.size() && !argv[i + 1].starts_with("--")) {
      ++i;
      if (arg != "--input") break;
    }
  }
  if (args.help) return args;
  if (argv.empty()) {
    throw core::ConfigError("tokenize needs a subcommand: " + std::string(kSubcommands) + kUsage);
  }
  args.subcommand = argv[0];
  if (args.subcommand != "train" && args.subcommand != "encode" && args.subcommand != "decode" &&
      !takes_no_files(args.subcommand)) {
    throw core::ConfigError("tokenize has no subcommand '" + args.subcommand + "' (" +
                            kSubcommands + ")" + kUsage);
  }
  std::set<std::string> given;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (!name.starts_with("--") || !allowed(args.subcommand, name)) {
      throw core::ConfigError("tokenize " + args.subcommand + ": unknown argument '" + arg + "'" +
                              kUsage);
    }
    if (name == "--force") {
      if (eq != std::string::npos) {
        throw core::ConfigError("--force takes no value, got '" + arg + "'" + kUsage);
      }
      args.force = true;
      continue;
    }
    if (name == "--input" && eq == std::string::npos) {
      // Every argument up to the next option is a file: `--input data/*.txt`.
      const size_t first = i + 1;
      while (i + 1 < argv.size() && !argv[i + 1].starts_with("--")) {
        args.inputs.push_back(argv[++i]);
      }
      if (i + 1 == first) throw core::ConfigError("--input needs at least one file" + kUsage);
      continue;
    }
    const std::string value = option_value(argv, i, kUsage);
    // The inputs add up; no other option may come twice.
    if (name != "--input" && name != "--input-list") require_given_once(given, name, kUsage);
    if (name == "--input") {
      args.inputs.push_back(value);
    } else if (name == "--input-list") {
      const std::vector<std::string> listed = read_input_list(value);
      args.inputs.insert(args.inputs.end(), listed.begin(), listed.end());
    } else if (name == "--tokenizer") {
      args.tokenizer = value;
    } else if (name == "--out") {
      args.out = value;
    } else if (name == "--out-dir") {
      args.out_dir = value;
    } else if (name == "--vocab-size") {
      args.vocab_size = parse_int(name, value);
    } else if (name == "--shard-tokens") {
      args.shard_tokens = parse_int(name, value);
    } else if (name == "--sample-bytes") {
      args.sample_bytes = parse_int(name, value);
    } else if (name == "--val-fraction") {
      args.val_fraction = parse_number(name, value);
    } else if (value == "bpe" || value == "unigram") {
      args.model_type = value;
    } else {
      throw core::ConfigError("--model-type takes bpe or unigram, got '" + value + "'" + kUsage);
    }
  }
  if (!takes_no_files(args.subcommand)) {
    require(!args.inputs.empty(), "--input FILE... (or --input-list LIST)", args);
  }
  if (args.subcommand == "train") {
    require(args.vocab_size.has_value(), "--vocab-size N", args);
    require(!args.out.empty(), "--out FILE", args);
  } else {
    require(!args.tokenizer.empty(), "--tokenizer FILE", args);
  }
  if (args.subcommand == "encode") require(!args.out_dir.empty(), "--out-dir DIR", args);
  return args;
}

// An error is reported on one line, whatever SentencePiece's messages hold.
std::string one_line(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return message;
}

int run(const std::vector<std::string>& argv) {
  try {
    const Args args = parse(argv);
    if (args.help) {
      std::fputs(kHelp, stdout);
    } else if (args.subcommand == "train") {
      train_tokenizer({args.inputs, *args.vocab_size, args.model_type, args.out, args.force,
                       args.sample_bytes});
    } else if (args.subcommand == "encode") {
      encode_to_shards({args.tokenizer, args.inputs, args.out_dir, args.val_fraction,
                        args.shard_tokens, args.force});
    } else if (args.subcommand == "decode") {
      decode_shards(args.tokenizer, args.inputs, stdout);
    } else if (args.subcommand == "info") {
      print_tokenizer_info(args.tokenizer, stdout);
    } else if (args.subcommand == "ids") {
      text_to_ids(args.tokenizer, stdin, stdout);
    } else {
      ids_to_text(args.tokenizer, stdin, stdout);
    }
    return kExitOk;
  } catch (const core::Interrupted& e) {
    std::fprintf(stderr, "mantissa: %s\n", e.what());
    core::end_by_signal(e.signal());
  } catch (const std::exception& e) {
    return report_failure(e, one_line(e.what()));
  }
}

}  // namespace
}  // namespace mantissa::launcher

int main(int argc, char** argv) {
  return mantissa::launcher::run(std::vector<std::string>(argv + 1, argv + argc));
}
