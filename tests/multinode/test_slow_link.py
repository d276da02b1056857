#!/usr/bin/env python3
"""A slow link: training across 2 hosts whose links tbf limits to 100 Mbit/s gives exactly the
numbers of the same training on one host.

A cluster of 2 hosts (scripts/start-cluster.sh). First, unshaped, 2 ranks on node1 train with
FP32, BF16 and FP8 (E4M3) gradient reduction: the references. Then every host's link is
limited (scripts/cluster-link.sh rate: tbf on both ends, 100mbit) and 1 rank on each host
trains the same way, with 1 MiB buckets so that a step's sync is many collectives in flight
while backward runs (and the progress thread drives them); BF16 also without overlap. Every
run must complete and log, at every step and on both ranks, the same loss, mean loss, loss
scale, overflow flag, gradient norm, learning rate and tokens as its reference: a reduction
combines the ranks' values in a fixed order whatever the link, the host, the timing or the
overlap. No timing is checked here: bench/bench_slow_link.sh measures what overlap and
reduced-precision reduction gain on such links.
"""

import os
import subprocess
import time

import cluster
from cluster import harness

STEPS = 12
RATE = "100mbit"
# (label, settings) of the shaped runs; each is compared with the unshaped run of its reduce
# dtype.
REDUCE_DTYPES = ("FP32", "BF16", "FP8_E4M3")
SHAPED = [(f"{d} overlap", d, ["dist.overlap=true"]) for d in REDUCE_DTYPES] + [
    ("BF16 no overlap", "BF16", ["dist.overlap=false"])]
# A GPT of 0.83M parameters (3.3 MB of FP32 gradients, 0.27 s per step at 100 Mbit/s): large
# enough that a step's sync spans several 1 MiB buckets and many tbf token-bucket refills.
MODEL = ["model.gpt2.n_layer=4", "model.gpt2.n_head=4", "model.gpt2.n_embd=128",
         "model.gpt2.seq_len=64", "model.gpt2.vocab_size=256", "data.micro_batch_size=2"]


def settings(run_dir, reduce_dtype, extra):
    base = [s for s in harness.SMALL_RUN_SETTINGS if not s.startswith(("model.", "data."))]
    return base + MODEL + [f"run.dir={run_dir}", f"run.steps={STEPS}", "run.eval_every=0",
                           f"dist.grad_reduce_dtype={reduce_dtype}", "dist.bucket_mb=1",
                           "dist.timeout_s=60"] + extra


def train(nodes, hostfile, argv_tail, out_path, what):
    argv = nodes.mpirun_argv(2, hostfile, env=["OMP_NUM_THREADS=1"]) + argv_tail
    limit = min(120, harness.time_left())
    start = time.monotonic()
    with open(out_path, "w") as out:
        try:
            run = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=nodes.env,
                                 timeout=limit)
        except subprocess.TimeoutExpired:
            harness.fail(f"{what} did not finish within {limit:.0f} s")
    if run.returncode != 0:
        with open(out_path) as f:
            harness.fail(f"{what} exited with {run.returncode}:\n{f.read()[-3000:]}")
    return time.monotonic() - start


def main():
    args = harness.parse_args()
    cluster.require_namespaces()
    cluster.isolate_network(args.source_dir)

    with cluster.work_directory(args, "mantissa-slow-link-") as (workdir, config, staged):
        with cluster.Cluster(args.source_dir, os.path.join(workdir, "cluster"), 2, slots=1) as nodes:
            one_host = nodes.write_hostfile("hostfile-node1", ["node1 slots=2"])
            references = {}
            for d in REDUCE_DTYPES:
                run_dir = os.path.join(workdir, f"ref-{d}")
                seconds = train(nodes, one_host, harness.train_argv(staged, config, settings(
                    run_dir, d, [])), run_dir + ".out", f"{d} on node1")
                references[d] = run_dir
                harness.log(f"reference {d}: 2 ranks on node1, unshaped, {seconds:.1f} s")
            for host in ("node1", "node2"):
                nodes.link("rate", host, RATE)
            harness.log(f"every link limited to {RATE}")
            for label, d, extra in SHAPED:
                run_dir = os.path.join(workdir, label.replace(" ", "-"))
                seconds = train(nodes, nodes.hostfile, harness.train_argv(staged, config, settings(
                    run_dir, d, extra)), run_dir + ".out", f"{label} across the shaped links")
                for rank in range(2):
                    got, want = cluster.exact_steps(run_dir, rank), cluster.exact_steps(references[d], rank)
                    if sorted(got) != list(range(STEPS)):
                        harness.fail(f"{label}: rank {rank} logged steps {sorted(got)}")
                    for step in range(STEPS):
                        if got[step] != want[step]:
                            harness.fail(f"{label}: rank {rank} step {step} logged {got[step]}, "
                                         f"the unshaped run on one host {want[step]}")
                harness.log(f"{label}: 1 rank on each host over {RATE} links, {seconds:.1f} s, "
                            f"every step bit-identical to the unshaped run on one host")
    print(f"PASS: across {RATE} links, FP32, BF16 and FP8 reduction (and BF16 without overlap) "
          "gave the numbers of one host, bit for bit", flush=True)


if __name__ == "__main__":
    main()
