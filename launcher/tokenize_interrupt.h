// Ctrl-C (or SIGTERM, SIGHUP) during `mantissa tokenize encode`, which may run for hours: the
// signal only raises a flag, the encode sees it within a chunk or a shard and unwinds, and the
// unwinding removes what it had made (StagedOutput's hidden files and the directories it
// created), so that an interrupted encode leaves the output directory as it found it. The first
// signal gives the signal back its default action: a second one ends the process at once.
#pragma once

#include <csignal>
#include <stdexcept>
#include <string>

namespace mantissa::launcher {

// What an interrupted encode throws; tokenize's main reports it and exits 128 + signal, the
// shell's code for a program a signal ended.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal);
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Installs the handlers while it lives and puts back the ones it found.
class InterruptWatch {
 public:
  InterruptWatch();
  ~InterruptWatch();
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  // Throws Interrupted when a signal came since the watch began.
  void throw_if_interrupted() const;

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_hup_{};
};

}  // namespace mantissa::launcher
