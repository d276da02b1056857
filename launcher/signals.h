// Stop signals. SIGUSR1 (Slurm's `--signal=USR1@90`, or `scancel --signal=USR1`; mpirun
// forwards it to every rank), SIGTERM, SIGHUP (the terminal went away) and SIGINT (Ctrl-C)
// only raise a flag: the Trainer polls
// it once per step and all ranks agree on the stop step through a MAX all-reduce, so a signal
// that reaches one rank stops them all at the same step with one checkpoint. SIGINT's handler
// says so on stderr and gives the signal back its default action, so that a second Ctrl-C
// ends the process at once, without the checkpoint; it wins over another stop signal that
// comes with it (exit 130). A signal the process was started to ignore (nohup's SIGHUP) stays
// ignored.
#pragma once

namespace mantissa::launcher {

// Installs the handlers (idempotent). Call it first thing, so that a signal during the setup
// (MPI, data, resume) is not lost either.
void install_stop_handlers();
// The signal that asked this process to stop, or 0.
int stop_signal();
// The training loop has begun: a Ctrl-C from here stops after the step under way, with a
// checkpoint, where before it the run stops at the start's end, before its first step. Only
// what a Ctrl-C's handler says differs.
void note_training_begun();

}  // namespace mantissa::launcher
