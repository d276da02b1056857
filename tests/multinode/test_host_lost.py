#!/usr/bin/env python3
"""A host lost: one host's link is cut in the middle of a 2-host run under mpirun.

A cluster of 2 hosts (scripts/start-cluster.sh, 1 slot each) trains under
deploy/mantissa-mpirun (mpirun with a bound on how long an aborted job may take to end) with
dist.timeout_s = 10 and a checkpoint every 25 steps. Once a few checkpoints exist, node2's
link goes down (scripts/cluster-link.sh down node2: nothing reaches it, nothing leaves it).
Then:
  - the surviving rank (rank 0 on node1) exits within dist.timeout_s + its probe grace
    (20% of the timeout, 1 to 10 s) + SLACK_S of the cut, having printed that rank 1 on host
    node2 did not answer, and ends the job with MPI_Abort's error code 3;
  - mpirun ends within MANTISSA_ABORT_GRACE_S + 5 s (the wrapper's SIGTERM, then SIGKILL) +
    SLACK_S of that, and the wrapper exits 3. (Left alone, Open MPI 4.1's mpirun waits about
    15 minutes for node2's daemon: deploy/mantissa-mpirun says why.);
  - no process of the run is left on node1 or on the machine (mpirun, the remote shells), and
    node2's rank has ended by itself (its own timeout); Open MPI's daemon on node2, which no
    one can reach, ends once the link is back (its retransmission meets a reset);
  - the newest checkpoint is intact: 2 ranks on node1, the surviving host, resume from exactly
    the newest complete step directory and train on; their per-step losses (and loss scale,
    gradient norm, learning rate) are bit-identical to those of an uninterrupted 2-rank run on
    node1, as are the steps the 2-host run logged before the cut.
"""

import os
import re
import signal
import subprocess
import time

import cluster
from cluster import harness

TIMEOUT_S = 10  # dist.timeout_s
PROBE_GRACE_S = min(max(0.2 * TIMEOUT_S, 1.0), 10.0)  # dist::World::abort_on_timeout's
ABORT_GRACE_S = 10  # MANTISSA_ABORT_GRACE_S
SLACK_S = 10  # a step in progress, MPI_Abort, a busy 2-core machine
CHECKPOINT_EVERY = 25
CUT_AFTER_STEP = 3 * CHECKPOINT_EVERY + 10


def settings(run_dir, steps):
    """The run's settings. The learning rate stays constant after warmup (min_lr_ratio 1), so
    that runs of different lengths (a run cut off, its resumption, the reference) take the
    same steps."""
    return harness.SMALL_RUN_SETTINGS + [
        f"run.dir={run_dir}", f"run.steps={steps}", f"dist.timeout_s={TIMEOUT_S}",
        f"checkpoint.every_steps={CHECKPOINT_EVERY}", "optimizer.min_lr_ratio=1"]


def complete_checkpoints(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(int(m.group(1)) for n in os.listdir(d)
                  if (m := re.fullmatch(r"step_(\d{8})", n)))


def run_to_end(nodes, wrapper, argv, out_path, what):
    """Runs a training (argv: mpirun ... mantissa train ...) to its end under the wrapper;
    fails the test on a non-zero exit."""
    limit = min(120, harness.time_left())
    with open(out_path, "w") as out:
        try:
            run = subprocess.run([wrapper] + argv[1:], stdout=out, stderr=subprocess.STDOUT,
                                 env=nodes.env, timeout=limit)
        except subprocess.TimeoutExpired:
            harness.fail(f"{what} did not finish within {limit:.0f} s:\n{cluster.tail(out_path)}")
    if run.returncode != 0:
        harness.fail(f"{what} exited with {run.returncode}:\n{cluster.tail(out_path)}")


def stop(job, workdir):
    """Ends what is left of the run after a failure: TERM to the wrapper (which passes it to
    mpirun), then KILL to every process running from the work directory, by PID."""
    if job is not None and job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for pid in cluster.processes_mentioning(workdir):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if job is not None and job.poll() is None:
        job.wait()


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    cluster.isolate_network(args.source_dir)
    wrapper = os.path.join(args.source_dir, "deploy", "mantissa-mpirun")

    job = None
    with cluster.work_directory(args, "mantissa-host-lost-") as (workdir, config, staged):
        try:
            with cluster.Cluster(args.source_dir, os.path.join(workdir, "cluster"), 2,
                                 slots=1) as nodes:
                env = dict(nodes.env, MANTISSA_ABORT_GRACE_S=str(ABORT_GRACE_S))
                run_dir = os.path.join(workdir, "run")
                out_path = os.path.join(workdir, "cut.out")
                argv = ([wrapper] + nodes.mpirun_argv(2, env=["OMP_NUM_THREADS=1"])[1:] +
                        harness.train_argv(staged, config, settings(run_dir, 1000000)))
                harness.log("2 hosts x 1 rank: " + " ".join(argv))
                with open(out_path, "w") as out:
                    job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                           cwd=workdir, start_new_session=True)

                def trained_a_while():
                    if job.poll() is not None:
                        harness.fail(f"the run ended early ({job.returncode}):\n"
                                     f"{cluster.tail(out_path)}")
                    return (max(cluster.exact_steps(run_dir, 0), default=-1) >= CUT_AFTER_STEP and
                            complete_checkpoints(run_dir))
                harness.wait_until(f"step {CUT_AFTER_STEP} and a checkpoint", trained_a_while,
                                   timeout=90, interval=0.2)

                # The surviving rank: gone from node1 within the bound.
                cut, rank_exit = cluster.cut_node2_until_rank0_exits(
                    nodes, run_dir, TIMEOUT_S + PROBE_GRACE_S + SLACK_S)
                harness.log(f"rank 0 exited {rank_exit:.1f} s after the cut")

                launcher_bound = ABORT_GRACE_S + 5 + SLACK_S
                try:
                    rc = job.wait(timeout=min(launcher_bound, harness.time_left()))
                except subprocess.TimeoutExpired:
                    harness.fail(f"mpirun (under deploy/mantissa-mpirun) still runs "
                                 f"{launcher_bound} s after rank 0 exited:\n{cluster.tail(out_path)}")
                launcher_exit = time.monotonic() - cut
                harness.log(f"the launcher exited with {rc}, {launcher_exit:.1f} s after the cut")
                output = open(out_path).read()
                print("--- output (without step lines) ---\n" +
                      "".join(line for line in output.splitlines(True) if not line.startswith("step ")))
                if rc != 3:
                    harness.fail(f"the launcher exited with {rc}, expected 3 (a peer rank stopped "
                                 "answering)")
                # "while saving the checkpoint of step N ..." when the cut came during a save.
                named = re.search(r"^mantissa: rank 0: .* did not complete within [0-9.]+ s "
                                  r"\(dist\.timeout_s\)( while [^;]*)?; rank\(s\) \[1\] did "
                                  r"not answer "
                                  r"\(host\(s\) node2\)$", output, re.M)
                if not named:
                    harness.fail("rank 0 did not report rank 1 on node2 as lost")
                if not re.search(r"MPI_ABORT was invoked on rank 0 .*\nwith errorcode 3\.", output):
                    harness.fail("rank 0 did not end the job with MPI_Abort's error code 3")

                # Nothing of the run left: on the hosts (node2's rank timed out by itself), and on
                # the machine (mpirun and the remote shells, which ran from the work directory).
                def left():
                    node2 = nodes.processes("node2")
                    return {"node1": nodes.processes("node1"),
                            "node2": {p: c for p, c in node2.items() if c == "mantissa"},
                            "the machine": {p: c for p, c in cluster.processes_mentioning(workdir).items()
                                            if p not in node2}}
                deadline = time.monotonic() + 10
                while any(left().values()) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if any(left().values()):
                    harness.fail(f"processes of the run are left: {left()}")
                harness.log("no process of the run is left on node1 or the machine, no rank on "
                            f"node2; node2 still runs {sorted(nodes.processes('node2').values())}")
                # Open MPI's daemon on node2 waits for mpirun, gone now; once the link is back, its
                # next retransmission gets a reset and it ends (the kernel retransmits at most every
                # 120 s).
                nodes.link("up", "node2")
                up = time.monotonic()
                deadline = up + 120 + SLACK_S
                while nodes.processes("node2") and time.monotonic() < deadline:
                    time.sleep(0.5)
                if nodes.processes("node2"):
                    harness.fail(f"node2 still runs {nodes.processes('node2')} "
                                 f"{time.monotonic() - up:.0f} s after its link came back")
                daemon_end = time.monotonic() - up
                harness.log(f"node2's daemon ended {daemon_end:.1f} s after its link came back")

                # The newest complete checkpoint resumes on the surviving host, and trains on to the
                # numbers of an uninterrupted run.
                cut_log = cluster.exact_steps(run_dir, 0)
                newest = complete_checkpoints(run_dir)[-1]
                steps = max(cut_log) + 20
                node1 = nodes.write_hostfile("hostfile-node1", ["node1 slots=2"])
                resume_out = os.path.join(workdir, "resume.out")
                run_to_end(nodes, wrapper, nodes.mpirun_argv(2, node1, env=["OMP_NUM_THREADS=1"]) +
                           harness.train_argv(staged, config, settings(run_dir, steps)),
                           resume_out, "the resumed run on node1")
                expected = f"mantissa: resumed from {run_dir}/checkpoints/step_{newest:08d} (saved by 2 ranks)"
                if expected not in open(resume_out).read():
                    harness.fail(f"the resumed run did not say '{expected}':\n"
                                 f"{cluster.tail(resume_out)}")
                reference_dir = os.path.join(workdir, "reference")
                run_to_end(nodes, wrapper, nodes.mpirun_argv(2, node1, env=["OMP_NUM_THREADS=1"]) +
                           harness.train_argv(staged, config, settings(reference_dir, steps)),
                           os.path.join(workdir, "reference.out"), "the uninterrupted run on node1")
                reference = cluster.exact_steps(reference_dir, 0)
                resumed = cluster.exact_steps(run_dir, 0)
                if sorted(reference) != list(range(steps)):
                    harness.fail(f"the uninterrupted run logged steps {sorted(reference)}, "
                                 f"expected 0..{steps - 1}")
                for step in range(steps):
                    got = resumed.get(step) if step >= newest else cut_log.get(step)
                    if step < newest and got is None:
                        continue  # logged before the cut only if the 2-host run got there
                    if got != reference.get(step):
                        harness.fail(f"step {step}: {'resumed' if step >= newest else '2-host'} run "
                                     f"logged {got}, the uninterrupted run {reference.get(step)}")
                harness.log(f"resumed from step {newest} on node1; steps {newest}..{steps - 1} and the "
                            f"{len([s for s in cut_log if s < newest])} steps logged before it are "
                            "bit-identical to an uninterrupted run")
        finally:
            stop(job, workdir)
    print(f"PASS: a host lost: rank 0 exited 3 naming rank 1 on node2 {rank_exit:.1f} s after the "
          f"cut (dist.timeout_s {TIMEOUT_S}), mpirun {launcher_exit:.1f} s after it "
          f"(MANTISSA_ABORT_GRACE_S {ABORT_GRACE_S}), nothing left (node2's daemon {daemon_end:.1f} s "
          f"after the link came back); resumed from step {newest} on node1 to the same numbers",
          flush=True)


if __name__ == "__main__":
    main()
