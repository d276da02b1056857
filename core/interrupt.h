// Ctrl-C (or SIGTERM, SIGHUP) during a command that writes files for minutes or hours
// (`mantissa tokenize encode`, `mantissa export`): the signal only raises a flag, the work sees
// it at its next check (between files, chunks, shards or tensors) and unwinds, and the
// unwinding removes what it had made (temporary files, the directories it created), so that an
// interrupted command leaves its output as it found it. Then the process ends by the same
// signal, so that a shell loop running such commands stops too. The first signal gives all
// three back their default action: a second one ends the process at once. A signal the process
// was started to ignore (nohup's SIGHUP) stays ignored. Training has its own handling
// (launcher/signals.h), which this never sees.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace mantissa::core {

// What an interrupted command throws. Its main reports it and ends the process by the signal
// (the shell sees 128 + signal).
class Interrupted : public std::runtime_error {
 public:
  Interrupted(int signal, const std::string& outcome);
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Throws Interrupted (saying `outcome`) when a signal came while an InterruptWatch lived; does
// nothing without one.
void throw_if_interrupted(
    const std::string& outcome = "nothing written, the output left as it was");

// Installs the handlers while it lives and puts back the ones it found.
class InterruptWatch {
 public:
  InterruptWatch();
  ~InterruptWatch();
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  // Runs `work` (the move of the files into place, which must not stop half way) with the
  // signals held back after a last throw_if_interrupted(); one that comes meanwhile is taken
  // when it ends. Call it with no other thread running.
  void run_uninterrupted(const std::function<void()>& work);
};

// Ends the process by `signal` (its default action), as if the signal had never been caught.
[[noreturn]] void end_by_signal(int signal);

}  // namespace mantissa::core
