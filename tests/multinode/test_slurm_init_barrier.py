#!/usr/bin/env python3
"""deploy/slurm/mantissa-multinode.sbatch's srun launch keeps every rank in MPI_Init until all
are there.

MPI_Init ends with a barrier (a PMIx fence that carries no data). Slurm 22.05's PMIx plugin runs
such fences over its tree collective unless told otherwise, and that tree let a rank on one node
leave MPI_Init while a rank on another was still inside it; the first message between them then
killed the late rank with SIGSEGV in Open MPI 4.1 (about 1 two-node launch in 190 on a busy
machine). The script sets SLURM_PMIX_FENCE=ring, which holds it (deploy/README.md).

A cluster of 2 hosts (scripts/start-cluster.sh) gets Slurm across them (scripts/start-slurm.sh
--hosts 2), and the script runs as a 2-node job of 1 task per node, MANTISSA naming a stand-in
for the binary: `config` prints a run directory, `train` runs mpi_init_exit_time ("rank R of N
left MPI_Init at T") under the hold_after_modex shim, which holds rank 0 for HOLD_S seconds
inside MPI_Init ("rank 0 held from T0 to T1"). All hosts read the machine's one clock. Rank 1
must leave MPI_Init after T1: without the setting it left within milliseconds of T0.
"""

import os
import re
import shutil
import subprocess
import sys

import cluster
from cluster import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from test_slurm import job_ended  # noqa: E402 (scontrol's view of a job)

HOLD_S = 3

STAND_IN = """#!/bin/sh
# mantissa as far as deploy/slurm/mantissa-multinode.sbatch uses it, for this test.
case "$1" in
  config) echo "$STAND_IN_RUN_DIR" ;;
  train) LD_PRELOAD="$STAND_IN_SHIM" exec "$STAND_IN_PROBE" ;;
  *) echo "stand-in for mantissa: unexpected command $1" >&2; exit 2 ;;
esac
"""


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    missing = [t for t in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun")
               if shutil.which(t) is None]
    if missing:
        cluster.skip(f"{', '.join(missing)} not installed (scripts/install-integration-deps.sh)")
    built = {name: os.path.join(args.build_dir, "bin", name)
             for name in ("mpi_init_exit_time", "hold_after_modex.so")}
    for path in built.values():
        if not os.path.exists(path):
            harness.fail(f"{path} is not built")
    cluster.isolate_network(args.source_dir)

    with cluster.work_directory(args, "mantissa-slurm-init-barrier-") as (workdir, config, _):
        # The hosts cannot see a build tree in /tmp (each has its own): copies beside the test's.
        probe, shim = (shutil.copy2(path, workdir) for path in built.values())
        stand_in = os.path.join(workdir, "mantissa-stand-in")
        with open(stand_in, "w") as f:
            f.write(STAND_IN)
        os.chmod(stand_in, 0o755)
        state_dir = os.path.join(workdir, "cluster")
        with cluster.Cluster(args.source_dir, state_dir, 2, slots=1) as nodes, \
                cluster.slurm(nodes) as slurm_dir:
            env = cluster.slurm_job_env(
                nodes, slurm_dir, MANTISSA=stand_in, MANTISSA_CONFIG=config,
                MANTISSA_METRICS_PORT="0", STAND_IN_RUN_DIR=os.path.join(workdir, "run"),
                STAND_IN_PROBE=probe, STAND_IN_SHIM=shim, HOLD_AFTER_MODEX_S=str(HOLD_S))
            check_barrier(args, env, workdir)


def check_barrier(args, env, workdir):
    script = os.path.join(args.source_dir, "deploy", "slurm", "mantissa-multinode.sbatch")
    output = os.path.join(workdir, "job.out")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--job-name=init-barrier", "--nodes=2", "--ntasks-per-node=1",
         "--cpus-per-task=1", f"--output={output}", f"--chdir={workdir}", script],
        env=env, capture_output=True, text=True, timeout=30)
    if submitted.returncode != 0:
        harness.fail(f"sbatch failed: {submitted.stderr}")
    job = submitted.stdout.strip().split(";")[0]
    harness.log(f"submitted job {job}: 2 nodes, rank 0 held {HOLD_S} s inside MPI_Init")
    info = harness.wait_until(f"job {job} to end", lambda: job_ended(job, env), timeout=90)
    with open(output) as f:
        text = f.read()
    print(f"--- job output ---\n{text}", flush=True)
    held = re.search(r"^rank 0 held from ([\d.]+) to ([\d.]+)$", text, re.M)
    left = {int(r): float(t) for r, t in
            re.findall(r"^rank (\d) of 2 left MPI_Init at ([\d.]+)$", text, re.M)}
    # The barrier first: where it fails, rank 0 may also die of rank 1's early message, and
    # the times say why.
    if held and 1 in left and left[1] < float(held.group(2)):
        harness.fail(f"rank 1 left MPI_Init {float(held.group(2)) - left[1]:.3f} s before rank "
                     f"0, held in it from {held.group(1)} to {held.group(2)}, went on: MPI_Init's "
                     "barrier did not hold across nodes (see SLURM_PMIX_FENCE in "
                     "deploy/slurm/mantissa-multinode.sbatch)")
    if info["JobState"] != "COMPLETED" or info.get("ExitCode") != "0:0":
        harness.fail(f"job {job} ended {info['JobState']} exit {info.get('ExitCode')}")
    if held is None:
        harness.fail("rank 0 was not held: the shim did not run (this Open MPI's MPI_Init does "
                     "not call mca_pml_base_bsend_init through its PLT?)")
    if sorted(left) != [0, 1]:
        harness.fail(f"ranks {sorted(left)} said when they left MPI_Init, not 0 and 1")
    held_to = float(held.group(2))
    harness.log(f"rank 1 left MPI_Init {left[1] - held_to:.3f} s after rank 0's {HOLD_S} s hold "
                f"ended ({left[0] - held_to:.3f} s for rank 0)")
    print("PASS: the multi-node script's srun launch held rank 1 in MPI_Init until rank 0, held "
          f"{HOLD_S} s inside it, went on", flush=True)


if __name__ == "__main__":
    main()
