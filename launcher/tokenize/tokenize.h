// `mantissa tokenize`: runs mantissa-tokenize, the executable beside this one.
//
// The tokenizer is SentencePiece, whose Debian library (libsentencepiece 0.1.97) carries its own
// copy of protobuf 3.14 and exports its symbols. In one process with libprotobuf 3.21, which
// this executable needs for configs and checkpoints, each library's calls bind to one copy: the
// process aborts at start ("compiled against version 3.14.0 ... not compatible") or crashes.
// So everything that links SentencePiece lives in mantissa-tokenize (launcher/tokenize_*.cpp),
// which links no protobuf, and this command replaces itself with it.
#pragma once

namespace mantissa::launcher {

// argv[1] is "tokenize"; argv[2...] go to mantissa-tokenize. Returns only when it cannot be
// started (exit code 1, with a message).
int tokenize_command(int argc, char** argv);

}  // namespace mantissa::launcher
