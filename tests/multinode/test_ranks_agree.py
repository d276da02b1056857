#!/usr/bin/env python3
"""Hosts with copies of their own: the ranks compare their tokens and their run directory
before they train.

A cluster of 2 hosts (scripts/start-cluster.sh, 2 slots each) gives every host a /tmp of its
own, as nodes' local disks are. The config names data at one path, /tmp/data/corpus.txt, and
each host holds its own copy there:
  - other text on node2 than on node1: every rank stops at the start with exit code 2, the
    message naming ranks [0, 1] on node1 and ranks [2, 3] on node2 with their token counts and
    fingerprints, no rank aborts (each finds the same difference), and run.dir is not made;
  - the same text on both hosts: the 4 ranks train to the end, a checkpoint at the end, and
    run.dir holds nothing of the start's check;
  - the same, with run.dir in /tmp (each host's own): refused at the start with exit code 2,
    naming ranks [2, 3] on node2 that cannot read what rank 0 wrote (before, training ran to
    its first checkpoint and failed there with exit code 1).
The cluster is stopped at the end, whatever happened, and nothing of it may be left.
"""

import os
import random
import re
import subprocess

import cluster
from cluster import harness

RUN_TIMEOUT_S = 90


def put_on_host(nodes, host, source, path):
    """Copies the shared file `source` to `path` on `host` (its own /tmp)."""
    agent = os.path.join(nodes.state_dir, "cluster-rsh-agent")
    copy = subprocess.run([agent, host, f"mkdir -p {os.path.dirname(path)} && cp {source} {path}"],
                          env=nodes.env, capture_output=True, text=True, timeout=30)
    if copy.returncode != 0:
        harness.fail(f"cannot write {path} on {host}: {copy.stderr}")


def train(nodes, binary, config, run_dir, out_path):
    """4 ranks, 2 per host, a checkpoint at the end; returns the CompletedProcess (output in
    out_path)."""
    settings = [s for s in harness.SMALL_RUN_SETTINGS if not s.startswith("data.")]
    settings += ["data.micro_batch_size=2", "data.text_file.path=/tmp/data/corpus.txt",
                 "run.steps=4", f"run.dir={run_dir}"]
    argv = nodes.mpirun_argv(4, env=["OMP_NUM_THREADS=1"]) + harness.train_argv(binary, config,
                                                                               settings)
    harness.log(" ".join(argv))
    with open(out_path, "w") as out:
        try:
            return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=nodes.env,
                                  timeout=min(RUN_TIMEOUT_S, harness.time_left()))
        except subprocess.TimeoutExpired:
            harness.fail(f"mpirun did not finish:\n{cluster.tail(out_path)}")


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    cluster.isolate_network(args.source_dir)
    with cluster.work_directory(args, "mantissa-ranks-agree-") as (workdir, config, staged):
        rng = random.Random(17)
        text = "".join(rng.choice("abcdefgh \n") for _ in range(40000))
        texts = {}
        for name, body in (("text", text), ("other", text[::-1])):
            texts[name] = os.path.join(workdir, f"{name}.txt")
            with open(texts[name], "w") as f:
                f.write(body)
        with cluster.Cluster(args.source_dir, os.path.join(workdir, "cluster"), 2) as nodes:
            put_on_host(nodes, "node1", texts["text"], "/tmp/data/corpus.txt")
            put_on_host(nodes, "node2", texts["other"], "/tmp/data/corpus.txt")
            run_dir = os.path.join(workdir, "run")
            out_path = os.path.join(workdir, "differ.out")
            differ = train(nodes, staged, config, run_dir, out_path)
            output = cluster.tail(out_path, 200)
            if differ.returncode != 2:
                harness.fail(f"other tokens on node2: exit {differ.returncode}, expected 2:\n{output}")
            pattern = (r"the ranks read different training tokens: ranks \[0, 1\] \(host node1\): "
                       r"(\d+) tokens \(fingerprint [0-9a-f]{16}\) from /tmp/data/corpus.txt; "
                       r"ranks \[2, 3\] \(host node2\): (\d+) tokens \(fingerprint [0-9a-f]{16}\)")
            found = re.search(pattern, output)
            if not found or found.group(1) != found.group(2):
                harness.fail(f"no message naming both hosts' tokens:\n{output}")
            if "MPI_ABORT" in output:
                harness.fail(f"a rank aborted; every rank should end alike:\n{output}")
            if os.path.exists(run_dir):
                harness.fail(f"the refused start left {run_dir}")
            harness.log("other tokens on node2: refused at the start, naming both hosts")

            put_on_host(nodes, "node2", texts["text"], "/tmp/data/corpus.txt")
            same = train(nodes, staged, config, run_dir, os.path.join(workdir, "same.out"))
            if same.returncode != 0:
                harness.fail(f"the same tokens on both hosts: exit {same.returncode}:\n"
                             f"{cluster.tail(os.path.join(workdir, 'same.out'))}")
            for rank in range(4):
                steps = sorted(cluster.exact_steps(run_dir, rank))
                if steps != [0, 1, 2, 3]:
                    harness.fail(f"rank {rank} logged steps {steps}, expected 0..3")
            left = [n for n in os.listdir(run_dir) if n.startswith(".shared")]
            if left:
                harness.fail(f"the start's check left {left} in {run_dir}")
            harness.log("the same tokens on both hosts: 4 steps trained")

            local_out = os.path.join(workdir, "local.out")
            local = train(nodes, staged, config, "/tmp/run", local_out)
            output = cluster.tail(local_out, 200)
            if local.returncode != 2:
                harness.fail(f"run.dir on each host's own /tmp: exit {local.returncode}, "
                             f"expected 2:\n{output}")
            expected = ('run.dir = "/tmp/run" is not one directory shared by every rank: ranks '
                        '[2, 3] (host node2) cannot read the file rank 0 (host node1) wrote there')
            if expected not in output or "MPI_ABORT" in output:
                harness.fail(f"no message naming node2's ranks, or a rank aborted:\n{output}")
            harness.log("run.dir on each host's own disk: refused at the start")
    print("PASS: hosts with other tokens, or a run.dir of their own, are refused at the start; "
          "with the same tokens and a shared run.dir, they train", flush=True)


if __name__ == "__main__":
    main()
