#include "launcher/tokenize/tokenize_client.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "launcher/exit_codes.h"
#include "launcher/signals.h"

extern char** environ;

namespace mantissa::launcher {

namespace {

// mantissa-tokenize beside this executable (as `mantissa tokenize` finds it), else on PATH.
std::string tokenize_executable() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "mantissa-tokenize" : (self.parent_path() / "mantissa-tokenize").string();
}

struct ChildResult {
  int status = 0;  // as waitpid reports it
  std::string out, err;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Runs `argv` with `input` on its stdin and collects its stdout and stderr. One poll loop
// feeds the one and drains the others, so that no pipe filling up can stall either process.
ChildResult run_child(const std::vector<std::string>& argv, const std::string& input) {
  int in[2], out[2], err[2];
  MANTISSA_REQUIRE(
      ::pipe2(in, O_CLOEXEC) == 0 && ::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0,
      kFailure, "cannot create pipes for " << argv[0] << ": " << std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  for (int* fd : {&in[0], &out[1], &err[1]}) close_fd(*fd);
  if (spawned != 0) {
    for (int* fd : {&in[1], &out[0], &err[0]}) close_fd(*fd);
    throw core::Error("cannot run " + argv[0] + ": " + std::strerror(spawned) +
                      " (build the mantissa-tokenize target)");
  }

  // A child that exits before reading all its input must give EPIPE here, not SIGPIPE.
  const auto old_sigpipe = std::signal(SIGPIPE, SIG_IGN);
  ::fcntl(in[1], F_SETFL, O_NONBLOCK);
  ChildResult result;
  size_t written = 0;
  if (input.empty()) close_fd(in[1]);
  while (in[1] >= 0 || out[0] >= 0 || err[0] >= 0) {
    pollfd fds[3] = {{in[1], POLLOUT, 0}, {out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (in[1] >= 0 && fds[0].revents != 0) {
      const ssize_t n = ::write(in[1], input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) close_fd(in[1]);
    }
    for (int k = 1; k < 3; ++k) {
      int& fd = k == 1 ? out[0] : err[0];
      if (fd < 0 || fds[k].revents == 0) continue;
      char buffer[1 << 16];
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0) {
        (k == 1 ? result.out : result.err).append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close_fd(fd);
      }
    }
  }
  for (int* fd : {&in[1], &out[0], &err[0]}) close_fd(*fd);
  std::signal(SIGPIPE, old_sigpipe);
  while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

// The child's message: its last stderr line without the "mantissa: " prefix.
std::string child_message(std::string err) {
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  const size_t line = err.rfind('\n');
  if (line != std::string::npos) err = err.substr(line + 1);
  for (const char* prefix : {"mantissa: error: ", "mantissa: "}) {
    if (err.starts_with(prefix)) return err.substr(std::strlen(prefix));
  }
  return err;
}

}  // namespace

TokenizerClient::TokenizerClient(std::string model_path) : path_(std::move(model_path)) {
  std::istringstream info(run("info", "", ""));
  std::string key_vocab, key_eot, key_never;
  info >> key_vocab >> vocab_size_ >> key_eot >> eot_ >> key_never;
  int32_t id = 0;
  while (info >> id) never_encoded_.push_back(id);
  MANTISSA_CHECK(
      info.eof() && key_vocab == "vocab_size" && key_eot == "eot" && key_never == "never_encoded",
      "mantissa-tokenize info printed something unexpected for '" << path_ << "'");
}

std::vector<int32_t> TokenizerClient::encode(const std::string& text) const {
  std::istringstream words(run("ids", text, "--prompt"));
  std::vector<int32_t> ids;
  int32_t id = 0;
  while (words >> id) ids.push_back(id);
  MANTISSA_CHECK(words.eof(), "mantissa-tokenize ids printed something that is not token ids");
  return ids;
}

std::string TokenizerClient::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) text += std::to_string(id) + " ";
  return run("text", text, "the generated tokens");
}

std::string TokenizerClient::run(const std::string& subcommand, const std::string& input,
                                 const std::string& what) const {
  // --tokenizer=PATH: a path that starts with "--" is no option of the child's.
  const std::vector<std::string> command{tokenize_executable(), subcommand, "--tokenizer=" + path_};
  ChildResult r = run_child(command, input);
  // A Ctrl-C or a job's SIGTERM sent to the whole process group ends the child too. Where this
  // process takes such a signal as a request to stop (the Trainer's handlers: the start goes on
  // and the run stops before its first step), the answer is still needed: ask again.
  for (int retry = 0; retry < 3 && WIFSIGNALED(r.status) && stop_signal() != 0; ++retry) {
    r = run_child(command, input);
  }
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == kExitOk) return r.out;
  const std::string message = (what.empty() ? "" : what + ": ") + child_message(r.err);
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == kExitConfig) {
    throw core::ConfigError(message);
  }
  // The child's message as it is: a location in it (a defect of mantissa-tokenize) stays the
  // only one.
  throw core::Error("mantissa-tokenize " + subcommand + " failed (" +
                    (WIFEXITED(r.status)
                         ? "exit code " + std::to_string(WEXITSTATUS(r.status))
                         : "killed by signal " + std::to_string(WTERMSIG(r.status))) +
                    "): " + message);
}

}  // namespace mantissa::launcher
