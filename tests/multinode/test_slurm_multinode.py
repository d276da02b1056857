#!/usr/bin/env python3
"""deploy/slurm/mantissa-multinode.sbatch as a real 2-node Slurm job on the test cluster.

A cluster of 2 hosts (scripts/start-cluster.sh) gets a Slurm cluster across them
(scripts/start-slurm.sh --hosts 2: slurmctld on the machine at 198.18.0.1, one slurmd inside
each host). Jobs of 2 nodes x 1 task, each rank on its own host, TCP between them:
  A  srun --mpi=pmix, run to the end: the reference for the others;
  B  srun, alongside A: `scancel --signal=USR1` (the job's steps, so every rank on every node)
     in the middle; every rank checkpoints and exits 0, the script sees the run stopped short
     and requeues the job, the next start resumes; every step's numbers, on both ranks, are
     bit-identical to A's;
  C  the same script with MANTISSA_LAUNCHER=mpirun (mpirun inside the allocation, through
     mantissa-mpirun found beside the binary): bit-identical to A;
  D  a host lost under srun, metrics on: while it trains (it has steps enough never to end by
     itself), a Prometheus server started here (on 198.18.0.1) scrapes both ranks at their
     hosts' addresses through the file_sd targets the job writes; then node2's link is cut;
     rank 0 on node1 exits within
     dist.timeout_s + probe grace + SLACK_S naming rank 1 on node2, the job's script exits with
     code 3 (Slurm keeps the job COMPLETING while node2 does not answer), no process of the job
     is left on node1 or the machine, node2's rank has ended too and the job's file_sd targets
     are gone; then node2's link comes
     back, 2 ranks on node1 (srun -w node1) resume from the newest checkpoint at or before the
     last step both ranks logged and redo, bit for bit, the steps job D had logged after it (D trains past A's
     last step while Prometheus finds it, so its own log is the reference), and Slurm finishes
     the job on node2, leaving nothing there.
Every run keeps a constant learning rate after warmup, so runs of different lengths take the
same steps. The cluster and Slurm are stopped at the end whatever happened.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import cluster
from cluster import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from test_slurm import job_info, job_ended  # noqa: E402 (scontrol's view of a job)

STEPS = 600
PREEMPT_AT_STEP = STEPS // 4
TIMEOUT_S = 10  # dist.timeout_s of job D
PROBE_GRACE_S = min(max(0.2 * TIMEOUT_S, 1.0), 10.0)
SLACK_S = 10
BRIDGE = "198.18.0.1"
NODE_ADDRESS = {"node1": "198.18.0.11", "node2": "198.18.0.12"}


def settings(run_dir, steps, timeout_s=60, every=STEPS // 4):
    return harness.SMALL_RUN_SETTINGS + [
        f"run.dir={run_dir}", f"run.steps={steps}", f"dist.timeout_s={timeout_s}",
        f"checkpoint.every_steps={every}", "optimizer.min_lr_ratio=1"]


def read(path):
    with open(path) as f:
        return f.read()


def free_port_on(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def start_prometheus(daemons, workdir, sd_dir):
    """Prometheus on the cluster's bridge address, scraping what the jobs' file_sd files name
    (deploy/prometheus/prometheus.yml's mantissa-slurm job, with intervals of a second)."""
    port = free_port_on(BRIDGE)
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: mantissa-slurm
    scrape_interval: 1s
    file_sd_configs:
      - files: ["{sd_dir}/*.json"]
        refresh_interval: 1s
""")
    proc = daemons.start("prometheus", [
        "prometheus", f"--config.file={config}",
        f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
        f"--web.listen-address={BRIDGE}:{port}", "--log.level=warn"])
    url = f"http://{BRIDGE}:{port}"
    harness.wait_ready(daemons, "prometheus", proc, url)
    return url


def compare(name, run_dir, reference_dir, steps):
    for rank in range(2):
        got, want = cluster.exact_steps(run_dir, rank), cluster.exact_steps(reference_dir, rank)
        if sorted(want) != list(steps):
            harness.fail(f"job A rank {rank} logged steps {sorted(want)}, expected "
                         f"{steps.start}..{steps.stop - 1}")
        for step in steps:
            if got.get(step) != want.get(step):
                harness.fail(f"job {name} rank {rank} step {step}: {got.get(step)}, the "
                             f"uninterrupted job A: {want.get(step)}")


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    missing = [t for t in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun",
                           "prometheus", "mpirun") if shutil.which(t) is None]
    if missing:
        cluster.skip(f"{', '.join(missing)} not installed (scripts/install-integration-deps.sh)")
    cluster.isolate_network(args.source_dir)

    with cluster.work_directory(args, "mantissa-slurm-multinode-") as (workdir, config, staged):
        # The sbatch script's mpirun launcher looks for mantissa-mpirun beside the binary.
        shutil.copy2(os.path.join(args.source_dir, "deploy", "mantissa-mpirun"),
                     os.path.join(workdir, "mantissa-mpirun"))
        state_dir = os.path.join(workdir, "cluster")
        with cluster.Cluster(args.source_dir, state_dir, 2, slots=1) as nodes, \
                cluster.slurm(nodes) as slurm_dir:
            daemons = harness.Daemons(workdir)
            try:
                # The binary and config; no metrics port unless a job asks for one.
                env = cluster.slurm_job_env(nodes, slurm_dir, MANTISSA=staged,
                                            MANTISSA_CONFIG=config, MANTISSA_METRICS_PORT="0")
                run(args, nodes, env, daemons, workdir, staged, config)
            finally:
                daemons.stop_all()


def run(args, nodes, env, daemons, workdir, staged, config):
    script = os.path.join(args.source_dir, "deploy", "slurm", "mantissa-multinode.sbatch")

    def submit(name, steps, job_settings=None, **job_env):
        run_dir = os.path.join(workdir, f"run-{name}")
        out = subprocess.run(
            ["sbatch", "--parsable", f"--job-name=mantissa-{name}", "--nodes=2",
             "--ntasks-per-node=1", "--cpus-per-task=1", f"--output={workdir}/{name}.out",
             f"--chdir={workdir}", script,
             *(job_settings or settings(run_dir, steps))],
            env=dict(env, MANTISSA_RUN_DIR=run_dir, **job_env), capture_output=True, text=True,
            timeout=30)
        if out.returncode != 0:
            harness.fail(f"sbatch failed: {out.stderr}")
        job = out.stdout.strip().split(";")[0]
        harness.log(f"submitted job {name}: {job}")
        return job, run_dir

    def wait_ended(name, job, timeout=120, completing=False):
        """Waits for the job's final state (with `completing`, also for COMPLETING once its
        batch script has exited: Slurm keeps a job whose node stopped answering COMPLETING
        until it declares the node down, SlurmdTimeout, 5 minutes by default)."""
        def ended():
            info = job_info(job, env)
            if completing and info.get("JobState") == "COMPLETING" and info.get("ExitCode") != "0:0":
                return info
            return job_ended(job, env)
        info = harness.wait_until(f"job {name} to end", ended, timeout=timeout)
        output = read(os.path.join(workdir, f"{name}.out"))
        print(f"--- job {name} output (without step lines) ---\n" +
              "".join(line for line in output.splitlines(True) if not line.startswith("step ")))
        return info, output

    def wait_completed(name, job):
        info, output = wait_ended(name, job)
        if info["JobState"] != "COMPLETED" or info.get("ExitCode") != "0:0":
            harness.fail(f"job {name} ended {info['JobState']} exit {info.get('ExitCode')}")
        return info, output

    job_a, run_a = submit("a", STEPS)
    job_b, run_b = submit("b", STEPS)

    # B: USR1 to the job's steps, every rank on both nodes, in the middle of the run.
    harness.wait_until(f"job b to reach step {PREEMPT_AT_STEP}",
                       lambda: max(cluster.exact_steps(run_b, 0), default=-1) >= PREEMPT_AT_STEP, timeout=90,
                       interval=0.2)
    subprocess.run(["scancel", "--signal=USR1", job_b], env=env, check=True, timeout=30)
    harness.log(f"job b at step {max(cluster.exact_steps(run_b, 0))}: scancel --signal=USR1")

    def requeued():
        info = job_info(job_b, env)
        return int(info.get("Restarts", 0)) >= 1 and info.get("JobState") == "PENDING"
    harness.wait_until("job b to be requeued", requeued, timeout=60)
    stopped_at = max(cluster.exact_steps(run_b, 0))
    # A restart within the second its first start ended is refused (revoked credentials).
    time.sleep(2)

    def released():
        if job_info(job_b, env).get("Reason") != "BeginTime":
            return True
        subprocess.run(["scontrol", "update", f"JobId={job_b}", "StartTime=now"], env=env,
                       check=True, timeout=30)
        return False
    harness.wait_until("job b to be released", released, timeout=30, interval=1)

    wait_completed("a", job_a)
    _, output_b = wait_completed("b", job_b)
    stops = re.findall(r"^mantissa: stop requested .*stopped after step (\d+)", output_b, re.M)
    if not stops or not re.search(r"^mantissa: resumed from .*\(saved by 2 ranks\)", output_b, re.M):
        harness.fail("job b did not stop on USR1 and resume from a 2-rank checkpoint")
    if not 0 <= stopped_at < STEPS - 1:
        harness.fail(f"job b stopped after step {stopped_at}: not in the middle")
    compare("b", run_b, run_a, range(STEPS))
    harness.log(f"job b stopped after step {stops[0]} on USR1, was requeued, resumed and matched "
                f"job a at every step on both ranks")

    # C: mpirun inside the allocation.
    job_c, run_c = submit("c", STEPS, MANTISSA_LAUNCHER="mpirun")
    wait_completed("c", job_c)
    compare("c", run_c, run_a, range(STEPS))
    harness.log("job c (mpirun inside the allocation) matched job a at every step on both ranks")

    host_lost_under_srun(nodes, env, daemons, workdir, staged, config, submit, wait_ended)
    print("PASS: 2-node Slurm jobs: Prometheus scraped both hosts via file_sd; USR1 to the steps "
          "checkpointed, requeued and resumed exactly; mpirun inside the allocation matched; a "
          "lost host ended the srun job with exit code 3 and its checkpoint resumed on node1",
          flush=True)


def host_lost_under_srun(nodes, env, daemons, workdir, staged, config, submit, wait_ended):
    sd_dir = os.path.join(workdir, "file_sd")
    os.mkdir(sd_dir)
    prometheus = start_prometheus(daemons, workdir, sd_dir)
    port = harness.free_port_block(1)
    every = 25
    run_d = os.path.join(workdir, "run-d")
    job_d, _ = submit("d", None, settings(run_d, 1000000, timeout_s=TIMEOUT_S, every=every),
                      MANTISSA_METRICS_PORT=str(port), MANTISSA_PROM_SD_DIR=sd_dir)
    sd_file = os.path.join(sd_dir, f"mantissa-{job_d}.json")

    def running():
        if job_ended(job_d, env):
            harness.fail(f"job d ended early:\n{read(os.path.join(workdir, 'd.out'))[-3000:]}")
        return True

    # Prometheus finds both ranks through the job's file_sd file, at the hosts' addresses.
    expected = {(f"{NODE_ADDRESS['node1']}:{port}", "0"), (f"{NODE_ADDRESS['node2']}:{port}", "1")}

    def scraped_both():
        series = harness.prom_query(prometheus, 'mantissa_steps_total{job=~"mantissa-slurm-run-d-[0-9a-f]{8}"} > 0')
        found = {(s["metric"]["instance"], s["metric"]["rank"]) for s in series}
        return running() and found == expected
    harness.wait_until("Prometheus to scrape both ranks of job d", scraped_both, timeout=90)
    targets = json.loads(read(sd_file))
    harness.log(f"job d's file_sd targets {targets[0]['targets']}; Prometheus scraped "
                f"{sorted(expected)} (instance, rank)")

    harness.wait_until("job d to train a while",
                       lambda: running() and max(cluster.exact_steps(run_d, 0), default=-1) >= 3 * every + 10,
                       timeout=90, interval=0.2)
    cut, rank_exit = cluster.cut_node2_until_rank0_exits(
        nodes, run_d, TIMEOUT_S + PROBE_GRACE_S + SLACK_S, label="job d: ")
    info, output = wait_ended("d", job_d, timeout=120, completing=True)
    job_exit = time.monotonic() - cut
    harness.log(f"job d: rank 0 exited {rank_exit:.1f} s after the cut, the job ended "
                f"{info['JobState']} exit {info.get('ExitCode')} {job_exit:.1f} s after it")
    if info.get("ExitCode") != "3:0":
        harness.fail(f"job d ended with exit code {info.get('ExitCode')}, expected 3:0")
    if not re.search(r"^mantissa: rank 0: .* rank\(s\) \[1\] did not answer \(host\(s\) node2\)$",
                     output, re.M):
        harness.fail("job d's rank 0 did not report rank 1 on node2 as lost")
    # A failed job leaves its targets, which no longer answer, for MantissaRankDown; the
    # script says so.
    if not os.path.exists(sd_file):
        harness.fail("job d (exit 3) removed its file_sd targets: its series would only go stale")
    if f"left the scrape targets {sd_file} of the failed job (exit 3)" not in output:
        harness.fail("job d's script did not say that it left its file_sd targets")
    os.remove(sd_file)

    # Nothing of the job is left on node1 or the machine (the cluster's daemons aside), and
    # node2's rank ended by itself.
    daemons = ("munged", "slurmctld", "slurmd", "prometheus")

    def left():
        node2 = nodes.processes("node2")
        return {"node1": {p: c for p, c in nodes.processes("node1").items() if c != "slurmd"},
                "node2": {p: c for p, c in node2.items() if c == "mantissa"},
                "the machine": {p: c for p, c in cluster.processes_mentioning(workdir).items()
                                if not c.startswith(daemons) and p not in node2}}
    deadline = time.monotonic() + 15
    while any(left().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if any(left().values()):
        harness.fail(f"processes of job d are left: {left()}")

    # node2's link comes back (Slurm ends the job there meanwhile), and the newest checkpoint
    # resumes on the surviving host and redoes the steps both ranks logged after it. A
    # checkpoint written after the last step either rank logged (the cut came between it and
    # the next step) would leave nothing to compare: it is removed, so the one before resumes.
    nodes.link("up", "node2")
    up = time.monotonic()
    logged = [cluster.exact_steps(run_d, rank) for rank in range(2)]
    last = min(max(logged[0], default=-1), max(logged[1], default=-1))
    checkpoints = os.path.join(run_d, "checkpoints")
    saved = sorted(int(m.group(1)) for n in os.listdir(checkpoints)
                   if (m := re.fullmatch(r"step_(\d{8})", n)))
    for step in saved:
        if step > last:
            shutil.rmtree(os.path.join(checkpoints, f"step_{step:08d}"))
    newest = max((step for step in saved if step <= last), default=None)
    if newest is None:
        harness.fail(f"job d saved no checkpoint at or before step {last}, the last both ranks "
                     f"logged: checkpoints {saved}")
    steps = last + 1
    argv = (["srun", "--mpi=pmix", "-w", "node1", "-N1", "-n2", "--cpus-per-task=1",
             "--cpu-bind=none", f"--chdir={workdir}", "--export=ALL,OMP_NUM_THREADS=1"] +
            harness.train_argv(staged, config, settings(run_d, steps, timeout_s=60, every=every)))
    limit = min(120, harness.time_left())
    try:
        resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        harness.fail(f"the resumption on node1 did not end within {limit:.0f} s")
    if resumed.returncode != 0:
        harness.fail(f"the resumption on node1 exited {resumed.returncode}:\n{resumed.stderr[-3000:]}")
    said = f"mantissa: resumed from {run_d}/checkpoints/step_{newest:08d} (saved by 2 ranks)"
    if said not in resumed.stdout + resumed.stderr:
        harness.fail(f"the resumption did not say '{said}'")
    for rank in range(2):
        redone = cluster.exact_steps(run_d, rank)
        for step in range(newest, steps):
            before = logged[rank].get(step)
            if before is None or redone.get(step) != before:
                harness.fail(f"job d resumed on node1, rank {rank} step {step}: "
                             f"{redone.get(step)}, before the cut: {before}")
    harness.log(f"job d's checkpoint of step {newest} resumed on node1 with 2 ranks and redid "
                f"steps {newest}..{steps - 1} as they were before the cut")

    # With node2 back, Slurm finishes the job there, and nothing of it is left on node2 either.
    harness.wait_until("job d to finish on node2", lambda: job_ended(job_d, env), timeout=90)
    harness.wait_until("node2 to run nothing but slurmd",
                       lambda: set(nodes.processes("node2").values()) <= {"slurmd"}, timeout=30)
    harness.log(f"job d finished on node2 and left nothing there "
                f"{time.monotonic() - up:.1f} s after its link came back")


if __name__ == "__main__":
    main()
