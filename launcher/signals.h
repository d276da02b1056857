// Preemption signals. SIGUSR1 (Slurm's `--signal=USR1@90`, or `scancel --signal=USR1`; mpirun
// forwards it to every rank) and SIGTERM only raise a flag: the Trainer polls it once per step
// and all ranks agree on the stop step through a MAX all-reduce, so a signal that reaches one
// rank stops them all at the same step with one checkpoint.
#pragma once

namespace mantissa::launcher {

// Installs the handlers (idempotent).
void install_stop_handlers();
// The signal that asked this process to stop, or 0.
int stop_signal();

}  // namespace mantissa::launcher
