#!/usr/bin/env python3
"""Same numbers across hosts: 2 hosts x 2 ranks train exactly as 1 host x 4 ranks.

A cluster of 2 hosts (scripts/start-cluster.sh) runs `mantissa train` under mpirun with the
hostfile `node1 slots=2, node2 slots=2` (ranks 0-1 on node1, 2-3 on node2, TCP across the
bridge between them), and with `node1 slots=4` (all 4 ranks on node1), in FP32 with FP32
gradient reduction and in BF16 with BF16 reduction. The global batch, the data each rank reads
and the order of every reduction depend on the rank and the number of ranks only, never on
where a rank runs or over which transport its bytes travel; so every rank's per-step log
(loss, mean_loss, loss_scale, overflow, grad_norm, lr, tokens) must be bit-identical between
the two layouts: no tolerance. Each rank records the host it ran on before it starts training,
and the test checks the placement too. The cluster is stopped at the end, whatever happened,
and nothing of it may be left.
"""

import json
import os
import subprocess
import time

import cluster
from cluster import harness

STEPS = 40
# The fields of a step's log line that depend on the arithmetic alone (not on timing).
MODES = (("FP32", "FP32"), ("BF16", "BF16"))  # precision.mode, dist.grad_reduce_dtype
# Every run is a few seconds on two cores; a hung one fails after this many.
RUN_TIMEOUT_S = 90


def write_hostfile(path, lines):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def train(nodes, binary, config, layout, hostfile, mode, reduce_dtype, workdir):
    """One 4-rank training; returns (its run directory, {rank: (hostname, local rank)})."""
    run_dir = os.path.join(workdir, f"{layout}-{mode}")
    settings = [s for s in harness.SMALL_RUN_SETTINGS if not s.startswith("precision.mode=")]
    settings += [f"precision.mode={mode}", f"dist.grad_reduce_dtype={reduce_dtype}",
                 f"run.steps={STEPS}", f"run.dir={run_dir}"]
    os.makedirs(os.path.join(run_dir, "hosts"))
    # Each rank writes down where it runs, then becomes the training rank (exec).
    record_host = ('echo "$(hostname) $OMPI_COMM_WORLD_LOCAL_RANK" '
                   '>"$0/hosts/$OMPI_COMM_WORLD_RANK" && exec "$@"')
    argv = (nodes.mpirun_argv(4, hostfile, env=["OMP_NUM_THREADS=1"]) +
            ["sh", "-c", record_host, run_dir] + harness.train_argv(binary, config, settings))
    harness.log(f"{layout} {mode}: " + " ".join(argv))
    start = time.time()
    limit = min(RUN_TIMEOUT_S, harness.time_left())
    with open(os.path.join(workdir, f"{layout}-{mode}.out"), "w") as out:
        try:
            run = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=nodes.env,
                                 timeout=limit)
        except subprocess.TimeoutExpired:
            harness.fail(f"{layout} {mode}: mpirun did not finish within {limit:.0f} s:\n" +
                         cluster.tail(out.name))
    if run.returncode != 0:
        harness.fail(f"{layout} {mode}: mpirun exited with {run.returncode}:\n{cluster.tail(out.name)}")
    harness.log(f"{layout} {mode}: {time.time() - start:.1f} s")
    hosts = {}
    for rank in range(4):
        with open(os.path.join(run_dir, "hosts", str(rank))) as f:
            host, local_rank = f.read().split()
            hosts[rank] = (host, int(local_rank))
    return run_dir, hosts


def exact_log(run_dir, rank):
    """{step: (cluster.EXACT_FIELDS)} of a rank's log; every step 0..STEPS-1 must be there."""
    entries = cluster.exact_steps(run_dir, rank)
    if sorted(entries) != list(range(STEPS)):
        harness.fail(f"{run_dir}: rank {rank} logged steps {sorted(entries)}, expected 0..{STEPS - 1}")
    return entries


def compare(mode, run_a, run_b):
    """Fails at the first step where any rank's numbers differ in any bit (floats as logged:
    shortest round-trip decimal, so equal text is equal bits)."""
    for rank in range(4):
        a, b = exact_log(run_a, rank), exact_log(run_b, rank)
        for step in range(STEPS):
            if a[step] != b[step]:
                diff = {f: (x, y) for f, x, y in zip(cluster.EXACT_FIELDS, a[step], b[step]) if x != y}
                harness.fail(f"{mode}: rank {rank} step {step} differs between 2 hosts x 2 ranks "
                             f"and 1 host x 4 ranks: {json.dumps(diff)}")
    last = exact_log(run_a, 0)[STEPS - 1]
    harness.log(f"{mode}: all {STEPS} steps of all 4 ranks bit-identical "
                f"(last step: mean_loss {last[1]!r}, loss_scale {last[2]}, grad_norm {last[4]!r})")


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    cluster.isolate_network(args.source_dir)

    with cluster.work_directory(args, "mantissa-multinode-") as (workdir, config, binary):
        with cluster.Cluster(args.source_dir, os.path.join(workdir, "cluster"), 2) as nodes:
            layouts = {
                "2x2": (nodes.hostfile, {0: ("node1", 0), 1: ("node1", 1),
                                         2: ("node2", 0), 3: ("node2", 1)}),
                "1x4": (write_hostfile(os.path.join(workdir, "hostfile-1x4"), ["node1 slots=4"]),
                        {r: ("node1", r) for r in range(4)}),
            }
            for mode, reduce_dtype in MODES:
                run_dirs = {}
                for layout, (hostfile, expected_hosts) in layouts.items():
                    run_dirs[layout], hosts = train(nodes, binary, config, layout, hostfile, mode,
                                                    reduce_dtype, workdir)
                    if hosts != expected_hosts:
                        harness.fail(f"{layout} {mode}: ranks ran on (host, local rank) {hosts}, "
                                     f"expected {expected_hosts}")
                compare(mode, run_dirs["2x2"], run_dirs["1x4"])
    print("PASS: same numbers on 2 hosts x 2 ranks as on 1 host x 4 ranks (FP32, BF16)", flush=True)


if __name__ == "__main__":
    main()
