#!/usr/bin/env python3
"""deploy/slurm's sbatch scripts on a real single-node Slurm cluster.

scripts/start-slurm.sh starts munged, slurmctld and slurmd (2 CPUs) in a temporary directory;
scripts/stop-slurm.sh stops them by PID at the end. Jobs of 2 tasks each:
  A  mantissa-1node.sbatch (mpirun), runs to completion undisturbed;
  B  the same training, receives USR1 in the middle (`scancel --batch --signal=USR1`, what
     Slurm sends 90 s before the time limit), checkpoints, exits 0, is requeued by the script,
     starts again, resumes from its checkpoint and finishes;
  C  mantissa-multinode.sbatch (srun --mpi=pmix) on the one node with metrics, a run that never
     ends by itself: its ranks serve metrics and it publishes its scrape targets for
     Prometheus' file_sd; then it is cancelled, and the targets must be gone;
  D  mantissa-1node.sbatch gets USR1 while it still reads its config: it requeues the job
     without starting the ranks (bash's default action for USR1 used to end the script, the job
     failed), and the requeue leaves no scrape targets behind.
A and B must complete with exit code 0, and B must end with the same losses and loss scales as A
(the CPU run is deterministic, so exactly the same). Every job asks for --cpus-per-task=1 on the
2-CPU node, and every start line of every job must report 1 thread per rank: the scripts set
OMP_NUM_THREADS from the allocation (without it each rank ran 2 threads, 4 on 2 cores).

Slurm's daemons cannot be bound to one address, so where the kernel allows it the whole test
runs in a private network namespace that nothing outside can reach (harness.isolate_network).
"""

import json
import os
import re
import subprocess
import sys
import time

import harness

# A step of this small model takes about 7 ms with one thread per rank on 2 idle cores (a
# Sapphire Rapids), more on a busy machine: enough steps after the signal that its way through
# Slurm, mantissa-mpirun and mpirun (up to about a second) ends while the job still runs, also
# on a machine a few times faster. (Test settings' tiny model took under 1 ms a step there.)
MODEL_SETTINGS = ["model.gpt2.n_embd=192", "model.gpt2.seq_len=64", "data.micro_batch_size=4"]
STEPS = 600
SIGNAL_AT_STEP = 60
# Job C runs until the test has seen it serve and cancels it: it must never end by itself.
SRUN_STEPS = 1000000


def job_info(job_id, env):
    out = subprocess.run(["scontrol", "show", "job", str(job_id)], env=env,
                         capture_output=True, text=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def job_ended(job_id, env):
    """The job's scontrol fields once it has reached a final state, else None."""
    info = job_info(job_id, env)
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    return info if info.get("JobState") in final else None


def read_json(path):
    with open(path) as f:
        return json.load(f)


def threads_per_rank(output):
    """The threads per rank of every start line ("mantissa: ... | 2 ranks on CPU (1 thread)
    | ...") in a job's output."""
    return [int(t) for t in re.findall(r"\| \d+ ranks? on CPU \((\d+) threads?\b", output)]


def steps_logged(run_dir, rank):
    """The steps of a rank's log, sorted; a last line cut short by a cancelled job skipped."""
    steps = []
    with open(os.path.join(run_dir, "log", f"rank{rank}.jsonl")) as f:
        for line in f:
            try:
                steps.append(json.loads(line)["step"])
            except ValueError:
                continue
    return sorted(steps)


def last_step(run_dir):
    """The newest step of rank 0's log, -1 before it has one. A line being written is skipped:
    at a few ms a step the log mostly ends in one."""
    try:
        return max(steps_logged(run_dir, 0), default=-1)
    except OSError:
        return -1


def main():
    args = harness.parse_args()
    if os.geteuid() != 0:
        harness.skip("the Slurm test runs a cluster as root")
    harness.require_tools("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "mpirun")
    binary = harness.mantissa_binary(args.build_dir)
    harness.isolate_network()

    with harness.Workdir("mantissa-slurm-", args.keep) as workdir:
        slurm_dir = os.path.join(workdir, "slurm")
        try:
            started = subprocess.run(
                [os.path.join(args.source_dir, "scripts", "start-slurm.sh"), slurm_dir],
                capture_output=True, text=True, timeout=90)
            print(started.stdout, started.stderr)
            if started.returncode != 0:
                harness.fail("scripts/start-slurm.sh failed")
            # No OMP_NUM_THREADS from the test's environment: the scripts must set it.
            env = dict({k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
                       SLURM_CONF=os.path.join(slurm_dir, "slurm.conf"),
                       OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       MANTISSA=binary, MANTISSA_CONFIG=harness.write_empty_config(workdir),
                       MANTISSA_METRICS_PORT="0")
            slurm_scripts = os.path.join(args.source_dir, "deploy", "slurm")

            def submit(name, script, steps, sbatch_args=(), default_run_dir=False, **job_env):
                # The default run directory is mantissa train's: runs/<config file name> in the
                # job's working directory.
                job_env = dict(env, **job_env)
                if not default_run_dir:
                    job_env["MANTISSA_RUN_DIR"] = os.path.join(workdir, f"run-{name}")
                settings = harness.SMALL_RUN_SETTINGS + MODEL_SETTINGS + [
                    f"run.steps={steps}", f"checkpoint.every_steps={steps // 2}"]
                out = subprocess.run(
                    ["sbatch", "--parsable", f"--job-name=mantissa-{name}", "--ntasks=2",
                     "--cpus-per-task=1", f"--output={workdir}/{name}.out",
                     f"--chdir={workdir}", *sbatch_args, os.path.join(slurm_scripts, script),
                     *settings],
                    env=job_env, capture_output=True, text=True, timeout=30)
                if out.returncode != 0:
                    harness.fail(f"sbatch failed: {out.stderr}")
                job_id = out.stdout.strip().split(";")[0]
                harness.log(f"submitted job {name}: {job_id}")
                return job_id

            def wait_completed(name, job_id, state="COMPLETED"):
                info = harness.wait_until(f"job {name} to end", lambda: job_ended(job_id, env),
                                          timeout=150)
                with open(os.path.join(workdir, f"{name}.out")) as f:
                    output = f.read()
                print(f"--- job {name} output (tail) ---\n" + output[-2500:])
                if info["JobState"] != state or (state == "COMPLETED" and
                                                 info.get("ExitCode") != "0:0"):
                    harness.fail(f"job {name} ended {info['JobState']} "
                                 f"exit {info.get('ExitCode')}, expected {state}")
                threads = threads_per_rank(output)
                if not threads or threads != [1] * len(threads):
                    harness.fail(f"job {name} (--cpus-per-task=1): its start lines report "
                                 f"{threads or 'no'} threads per rank, expected 1")
                return info

            # Every job needs both CPUs: Slurm runs them one after the other.
            job_a = submit("a", "mantissa-1node.sbatch", STEPS, default_run_dir=True)
            # B serves metrics and publishes its scrape targets (file_sd) while it runs.
            port_b = harness.free_port_block(2)
            sd_dir = os.path.join(workdir, "file_sd")
            os.mkdir(sd_dir)
            job_b = submit("b", "mantissa-1node.sbatch", STEPS,
                           MANTISSA_METRICS_PORT=str(port_b), MANTISSA_METRICS_BIND="127.0.0.1",
                           MANTISSA_PROM_SD_DIR=sd_dir)
            run_b = os.path.join(workdir, "run-b")
            # Exporters bound to loopback are published as 127.0.0.1 (Prometheus on the node).
            host = "127.0.0.1"

            harness.wait_until(f"job b to reach step {SIGNAL_AT_STEP}",
                               lambda: last_step(run_b) >= SIGNAL_AT_STEP, timeout=150,
                               interval=0.1)
            sd_file_b = os.path.join(sd_dir, f"mantissa-{job_b}.json")
            targets_b = read_json(sd_file_b)
            # The job label: the run directory's name and `realpath DIR | cksum` in hex.
            path_sum = subprocess.run(["cksum"], input=run_b + "\n", capture_output=True,
                                      text=True, check=True).stdout.split()[0]
            if targets_b != [{"targets": [f"{host}:{port_b + r}" for r in range(2)],
                              "labels": {"job": f"mantissa-slurm-run-b-{int(path_sum):08x}",
                                         "slurm_job_name": "mantissa-b"}}]:
                harness.fail(f"job b's file_sd targets are {targets_b}")
            if 'mantissa_steps_total{rank="1"}' not in harness.http_get(
                    f"http://{host}:{port_b + 1}/metrics"):
                harness.fail("job b's published rank 1 target serves no mantissa_steps_total")
            harness.log(f"job b at step {last_step(run_b)}: sending USR1 to its batch script")
            subprocess.run(["scancel", "--batch", "--signal=USR1", job_b], env=env, check=True)

            # The script requeues the job once the ranks have checkpointed. Slurm holds a
            # requeued job back for two minutes; an operator (here: the test) may release it.
            def requeued():
                info = job_info(job_b, env)
                return int(info.get("Restarts", 0)) >= 1 and info.get("JobState") == "PENDING"

            harness.wait_until("job b to be requeued", requeued, timeout=60)
            stopped_at = last_step(run_b)
            harness.log(f"job b requeued after step {stopped_at}; releasing it")
            # Killing the first start revoked the job's credentials issued up to that second;
            # a restart within the same second is refused ("Job credential revoked") and the
            # job fails. Slurm's own requeue delay avoids that; releasing early must wait it out.
            time.sleep(2)

            def released():
                if job_info(job_b, env).get("Reason") != "BeginTime":
                    return True
                subprocess.run(["scontrol", "update", f"JobId={job_b}", "StartTime=now"],
                               env=env, check=True)
                return False

            harness.wait_until("job b to be released", released, timeout=30, interval=1)

            # C: srun --mpi=pmix, metrics on, scrape targets published while it runs, until
            # it is cancelled.
            metrics_port = harness.free_port_block(2)
            job_c = submit("c", "mantissa-multinode.sbatch", SRUN_STEPS,
                           ["--nodes=1", "--ntasks-per-node=2"],
                           MANTISSA_METRICS_PORT=str(metrics_port),
                           MANTISSA_METRICS_BIND="127.0.0.1", MANTISSA_PROM_SD_DIR=sd_dir)

            if wait_completed("a", job_a).get("Restarts") != "0":
                harness.fail("job a was restarted")
            wait_completed("b", job_b)
            # The second start resumed from the checkpoint the stop wrote (a start from step 0
            # would log the same steps again, and the comparison below would not notice).
            with open(os.path.join(workdir, "b.out")) as f:
                output_b = f.read()
            resumed = (rf"mantissa: resumed from \S*/step_{stopped_at + 1:08d} "
                       r"\(saved by 2 ranks\)")
            if not re.search(resumed, output_b):
                harness.fail(f"job b's second start did not resume from the checkpoint of step "
                             f"{stopped_at + 1} (no line matching {resumed!r})")
            if os.path.exists(sd_file_b):
                harness.fail(f"job b left its file_sd targets behind: {sd_file_b}")
            if not 0 <= stopped_at < STEPS - 1:
                harness.fail(f"job b stopped after step {stopped_at}: not in the middle")
            log_a = harness.read_step_log(os.path.join(workdir, "runs", "train"), 0)
            log_b = harness.read_step_log(run_b, 0)
            if sorted(log_a) != list(range(STEPS)) or sorted(log_b) != list(range(STEPS)):
                harness.fail(f"steps missing: a logged {sorted(log_a)}, b {sorted(log_b)}")
            final = STEPS - 1
            a, b = log_a[final], log_b[final]
            harness.log(f"final step {final}: a loss {a['loss']} scale {a['loss_scale']}, "
                        f"b loss {b['loss']} scale {b['loss_scale']}")
            differ = [s for s in range(STEPS) if (log_a[s]["loss"], log_a[s]["loss_scale"]) !=
                      (log_b[s]["loss"], log_b[s]["loss_scale"])]
            if differ:
                harness.fail(f"the interrupted and resumed job b differs from a at steps {differ}")
            harness.log(f"job b stopped after step {stopped_at}, was requeued, resumed and "
                        "matched the uninterrupted job at every step")

            # While C runs: its file_sd targets name both local ranks' ports, which serve.
            sd_file = os.path.join(sd_dir, f"mantissa-{job_c}.json")
            targets = harness.wait_until("job c's file_sd targets",
                                         lambda: read_json(sd_file), timeout=150)
            expected = [f"{host}:{metrics_port + r}" for r in range(2)]
            if targets[0]["targets"] != expected:
                harness.fail(f"file_sd targets {targets}, expected {expected}")
            scraped = harness.wait_until(
                "job c's rank 1 metrics",
                lambda: harness.http_get(f"http://127.0.0.1:{metrics_port + 1}/metrics"),
                timeout=60, interval=0.2)
            if 'mantissa_steps_total{rank="1"}' not in scraped:
                harness.fail("job c's rank 1 serves no mantissa_steps_total")
            run_c = os.path.join(workdir, "run-c")
            harness.wait_until("job c's rank 1 to log 50 steps",
                               lambda: len(steps_logged(run_c, 1)) >= 50, timeout=60)
            subprocess.run(["scancel", job_c], env=env, check=True, timeout=30)
            wait_completed("c", job_c, state="CANCELLED")
            if os.path.exists(sd_file):
                harness.fail(f"job c left its file_sd targets behind: {sd_file}")
            logged_c = steps_logged(run_c, 1)
            if logged_c != list(range(len(logged_c))):
                harness.fail(f"job c (srun) skipped steps on rank 1: {logged_c}")
            harness.log(f"job c logged steps 0..{logged_c[-1]} on rank 1 before it was cancelled")

            # D: USR1 while the script is still reading its config, before its ranks exist. The
            # mantissa it runs holds `mantissa config` until the test has sent the signal.
            held, go = os.path.join(workdir, "d-held"), os.path.join(workdir, "d-go")
            wrapper = os.path.join(workdir, "held-mantissa")
            with open(wrapper, "w") as f:
                f.write(f"#!/bin/sh\nif [ \"$1\" = config ] && [ ! -e {held} ]; then\n"
                        f"  touch {held}\n"
                        f"  for i in $(seq 600); do [ -e {go} ] && break; sleep 0.1; done\n"
                        f'fi\nexec {binary} "$@"\n')
            os.chmod(wrapper, 0o755)
            job_d = submit("d", "mantissa-1node.sbatch", STEPS, MANTISSA=wrapper,
                           MANTISSA_METRICS_PORT=str(harness.free_port_block(2)),
                           MANTISSA_METRICS_BIND="127.0.0.1", MANTISSA_PROM_SD_DIR=sd_dir)
            harness.wait_until("job d to read its config", lambda: os.path.exists(held),
                               timeout=150)
            subprocess.run(["scancel", "--batch", "--signal=USR1", job_d], env=env, check=True)
            time.sleep(3)  # Slurm delivers it in milliseconds, while `config` still runs
            open(go, "w").close()
            harness.wait_until("job d to be requeued", lambda: int(
                job_info(job_d, env).get("Restarts", 0)) >= 1, timeout=60)
            subprocess.run(["scancel", job_d], env=env, check=True, timeout=30)
            harness.wait_until("job d to end", lambda: job_ended(job_d, env), timeout=60)
            with open(os.path.join(workdir, "d.out")) as f:
                output_d = f.read()
            print("--- job d output ---\n" + output_d[-2500:])
            if "requeueing job" not in output_d or "mantissa: " in output_d:
                harness.fail("job d, signalled before its ranks started, was not requeued "
                             "without starting them")
            if os.path.exists(os.path.join(sd_dir, f"mantissa-{job_d}.json")):
                harness.fail("job d left its file_sd targets behind after its requeue")
            print("PASS: the 1-node script ran, was preempted, requeued and resumed exactly; "
                  "both published file_sd targets; the multi-node script ran under srun "
                  "--mpi=pmix; a USR1 before the ranks started requeued the job at once")
        finally:
            # On failure the cluster's logs stay with the rest of the work directory.
            keep = args.keep or sys.exc_info()[0] is not None
            subprocess.run([os.path.join(args.source_dir, "scripts", "stop-slurm.sh"),
                            slurm_dir], env=dict(os.environ, KEEP="1" if keep else "0"))


if __name__ == "__main__":
    main()
