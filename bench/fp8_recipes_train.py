#!/usr/bin/python3
"""Training with each FP8 recipe next to BF16, in one table (issue 17's training comparison).

Trains the same GPT-2 on the machine's text (/usr/share/common-licenses concatenated, every
byte a token, the tail 10% held out) with precision.mode BF16 and FP8_HYBRID under the DELAYED
(per-tensor), BLOCKWISE, ROWWISE and MXFP8 recipes, for the same seeds and the same number of
steps, and prints each recipe's final held-out loss and its gap to BF16 (mean and spread over
the seeds; the gap is taken seed by seed, so the data order, which is a function of the seed,
cancels). The anchor is BF16 trained in the same invocation.

  /usr/bin/python3 bench/fp8_recipes_train.py [--build build] [--seeds 3] [--steps 300]
                                              [--jobs 2] [--reference]

Default: a small GPT-2 (4 layers, n_embd 128, 128 tokens, micro-batch 8: every K of its FP8
GEMMs whole 128-element blocks), about 10 minutes on two busy cores. --reference trains the
reference configuration instead (6 layers, n_embd 384, 256 tokens, micro-batch 8: configs/
gpt2.pbtxt's shapes at vocab 256), which takes hours on a CPU. Runs go two at a time with one
OpenMP thread each (--jobs). Figures only: nothing passes or fails here.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LICENSES = "/usr/share/common-licenses"

RECIPES = [("BF16", None), ("DELAYED", "DELAYED"), ("BLOCKWISE", "BLOCKWISE"),
           ("ROWWISE", "ROWWISE"), ("MXFP8", "MXFP8")]

SMALL = "n_layer: 4 n_head: 4 n_embd: 128 seq_len: 128"
REFERENCE = "n_layer: 6 n_head: 6 n_embd: 384 seq_len: 256"

CONFIG = """
run {{ steps: {steps} seed: {seed} device: CPU log_every: 50 eval_every: {steps}
      eval_tokens: 32768 dir: "{dir}" }}
model {{ gpt2 {{ {model} vocab_size: 256 }} }}
data {{ text_file {{ path: "{text}" }} micro_batch_size: 8 }}
optimizer {{ adamw {{ lr: 0.002 weight_decay: 0.1 }} warmup_steps: {warmup} min_lr_ratio: 0.1 }}
precision {{ mode: {mode} {fp8} }}
checkpoint {{ every_steps: 0 resume: NEVER }}
"""


def corpus(directory):
    path = os.path.join(directory, "licenses.txt")
    with open(path, "wb") as out:
        for name in sorted(os.listdir(LICENSES)):
            source = os.path.join(LICENSES, name)
            if os.path.isfile(source) and not os.path.islink(source):
                with open(source, "rb") as f:
                    out.write(f.read())
    return path


def train(args, workdir, text, name, recipe, seed):
    run_dir = os.path.join(workdir, f"{name}-{seed}")
    config = CONFIG.format(
        steps=args.steps, seed=seed, dir=run_dir, model=REFERENCE if args.reference else SMALL,
        text=text, warmup=max(1, args.steps // 10),
        mode="FP8_HYBRID" if recipe else "BF16",
        fp8=f"fp8 {{ recipe: {recipe} }}" if recipe else "")
    path = os.path.join(workdir, f"{name}-{seed}.pbtxt")
    with open(path, "w") as f:
        f.write(config)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.time()
    result = subprocess.run([os.path.join(args.build, "bin", "mantissa"), "train", "--config",
                             path, "--progress", "lines"], env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        sys.exit(f"{name} seed {seed} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    records = [json.loads(line) for line in open(os.path.join(run_dir, "log", "rank0.jsonl"))]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    losses = [r["loss"] for r in records]
    tail = losses[-max(1, len(losses) // 10):]
    return {"val": val[-1], "train": sum(tail) / len(tail), "seconds": time.time() - start}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()

    seeds = list(range(1, args.seeds + 1))
    with tempfile.TemporaryDirectory(prefix="fp8_recipes_") as workdir:
        text = corpus(workdir)
        # The losses' last bits depend on the GEMM path (a native BF16 kernel flushes
        # subnormals), so the paths the runs take are printed with them.
        subprocess.run([os.path.join(args.build, "bin", "bench_cpu_paths")], check=True)
        print(f"GPT-2 {REFERENCE if args.reference else SMALL}, vocab 256, micro-batch 8, "
              f"{args.steps} steps, seeds {seeds}, text {os.path.getsize(text)} bytes "
              f"({LICENSES})", flush=True)
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for name, recipe in RECIPES:
                for seed in seeds:
                    jobs[(name, seed)] = pool.submit(train, args, workdir, text, name, recipe,
                                                     seed)
            results = {key: job.result() for key, job in jobs.items()}

    print("\nFinal held-out loss (run.eval_tokens 32768, after the last step) and the mean "
          "training loss of the last 10% of steps; gap = (recipe - BF16) / BF16 per seed, "
          "mean +- sample standard deviation over the seeds")
    print(f"{'recipe':<10} | {'val loss':>16} | {'val gap %':>15} | {'train loss':>10} | "
          f"{'train gap %':>15} | {'s/run':>6}")
    for name, _ in RECIPES:
        vals = [results[(name, s)]["val"] for s in seeds]
        trains = [results[(name, s)]["train"] for s in seeds]
        val_gaps = [100 * (results[(name, s)]["val"] - results[("BF16", s)]["val"]) /
                    results[("BF16", s)]["val"] for s in seeds]
        train_gaps = [100 * (results[(name, s)]["train"] - results[("BF16", s)]["train"]) /
                      results[("BF16", s)]["train"] for s in seeds]
        seconds = statistics.mean(results[(name, s)]["seconds"] for s in seeds)

        def spread(values):
            return statistics.stdev(values) if len(values) > 1 else 0.0

        print(f"{name:<10} | {statistics.mean(vals):7.4f} +- {spread(vals):6.4f} | "
              f"{statistics.mean(val_gaps):+6.2f} +- {spread(val_gaps):5.2f} | "
              f"{statistics.mean(trains):10.4f} | "
              f"{statistics.mean(train_gaps):+6.2f} +- {spread(train_gaps):5.2f} | "
              f"{seconds:6.0f}")


if __name__ == "__main__":
    main()
