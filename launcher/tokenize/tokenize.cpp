#include "launcher/tokenize/tokenize.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "launcher/exit_codes.h"

namespace mantissa::launcher {

int tokenize_command(int argc, char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string tool = "mantissa-tokenize";
  if (!ec) tool = (self.parent_path() / tool).string();
  std::vector<char*> args = {tool.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(tool.c_str(), args.data());
  std::fprintf(stderr, "mantissa: error: cannot run %s: %s (build the mantissa-tokenize target)\n",
               tool.c_str(), std::strerror(errno));
  return kExitFailure;
}

}  // namespace mantissa::launcher
