// Exit codes of the mantissa executable (also listed by `mantissa train --help`): 0 for
// success, otherwise the kind of the error that ended the run (core::ErrorKind, where each
// code is explained).
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"

namespace mantissa::launcher {

// The run finished all its steps, or it was asked to stop (SIGUSR1, SIGTERM or SIGHUP) and every
// rank stopped at the same step after its checkpoint was written: requeue it to continue.
inline constexpr int kExitOk = 0;
// Stopped the same way by SIGINT (Ctrl-C), with the shell's code for an interrupted program, so
// that a script running `mantissa train && next` does not go on as if the run were done.
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitFailure = core::exit_code(core::ErrorKind::kFailure);
inline constexpr int kExitConfig = core::exit_code(core::ErrorKind::kConfig);
inline constexpr int kExitDiverged = core::exit_code(core::ErrorKind::kDiverged);

// How a command that failed ends: "mantissa: <message>" and kExitConfig for what the user must
// change (a core::Error of kind kConfig), "mantissa: error: <message>" and the code of the
// error's kind otherwise (kExitFailure for anything but a core::Error). `message` defaults to
// the error's own (core::error_text).
inline int report_failure(const std::exception& e, const std::string& message) {
  const auto* error = dynamic_cast<const core::Error*>(&e);
  const core::ErrorKind kind = error ? error->kind() : core::ErrorKind::kFailure;
  std::fprintf(stderr,
               kind == core::ErrorKind::kConfig ? "mantissa: %s\n" : "mantissa: error: %s\n",
               message.c_str());
  return core::exit_code(kind);
}
inline int report_failure(const std::exception& e) {
  return report_failure(e, core::error_text(e));
}

}  // namespace mantissa::launcher
