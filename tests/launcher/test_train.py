"""Whole training runs of the real binary under `mpirun -np 2` (and alone):
 - every rank writes log/rank<R>.jsonl with the required keys, the loss falls, the ranks agree
   on the mean loss, the loss scale and every skip decision, and an inf planted on rank 1
   (debug.inject_nonfinite_*) skips that step on both ranks, attributed on rank 1 only;
 - SIGUSR1 sent to rank 1 alone stops both ranks at the same step with a checkpoint, exit 0;
   running the same command again resumes there and ends with exactly the losses, loss scales
   and gradient norms of an uninterrupted run, with and without ZeRO-1 (under ZeRO-1 also the
   same weights, as `mantissa export` stitches them from the shards of the last checkpoint);
 - a 2-rank checkpoint resumes on one rank (twice the micro-batch) close to the 2-rank run, and
   a 2-rank ZeRO-1 checkpoint (sharded masters and moments) on one rank and on four;
 - SIGTERM stops a single rank the same way; a stop during the start (the run held in its
   first print) ends it before its first step, nothing saved;
 - model.init_from starts a run from an llm.c GPT-2 file, and `mantissa export` writes the
   weights of its checkpoint as safetensors, the same bytes; `mantissa export --format hf`
   writes a GPT-2's and a Llama's weights as a Hugging Face directory, which model.init_from
   reads back unchanged;
 - a checkpoint saved by another model is refused with exit code 2 (a config error);
 - ranks with other settings or other tokens (each its own program and working directory
   under mpirun, as hosts with their own copies), or a relative run.dir that is another
   directory for each, stop at the start with exit code 2, naming what differs, and so does a
   config refused on rank 1 alone; the same tokens at other paths train;
 - llm.c's Llama-3 shards (uint32 tokens) train a vocabulary past 2^16, and a token past the
   vocabulary stops the run with exit code 2 naming the shard and the position;
 - the divergence guard: gradients non-finite at the minimum loss scale for
   max_overflows_at_min steps, or a non-finite loss, end the run with exit code 4;
 - a rank that never starts MPI, or one held before MPI_Finalize, ends the job with exit code 3
   at MANTISSA_MPI_START_TIMEOUT_S.
"""

import array
import fcntl
import glob
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import launcher_util as lu

RANKS = 2


def waiting_in(pid):
    """The kernel function a process sleeps in (/proc/PID/wchan), "" once it is gone."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read()
    except FileNotFoundError:
        return ""


class Training(lu.TempDirTest):
    def run_dir(self, name):
        return os.path.join(self.dir, name)

    def train_args(self, name, *sets, inject_rank=1):
        """Arguments of a run of TINY_GPT into run.dir <tmp>/<name>, with an inf planted on
        rank `inject_rank` at step 7."""
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        args = ["train", "--config", config, "--progress", "lines",
                "--set", f"run.dir={self.run_dir(name)}",
                "--set", f"debug.inject_nonfinite_rank={inject_rank}",
                "--set", "debug.inject_nonfinite_steps=7"]
        for s in sets:
            args += ["--set", s]
        return args

    def assert_same_trajectory(self, a, b, keys=("mean_loss", "loss", "loss_scale", "grad_norm",
                                                  "overflow", "lr", "epoch")):
        self.assertEqual([e["step"] for e in a], [e["step"] for e in b])
        for x, y in zip(a, b):
            for key in keys:
                self.assertEqual(x[key], y[key], f"step {x['step']}: {key}")

    def test_two_ranks_log_learn_and_agree(self):
        result = self.mantissa(*self.train_args("full"), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("# effective config"), 1, "printed by rank 0 only")
        run = self.run_dir("full")
        logs = [lu.read_log(run, r) for r in range(RANKS)]
        for rank, log in enumerate(logs):
            self.assertEqual([e["step"] for e in log], list(range(60)), f"rank {rank}")
            for entry in log:
                self.assertTrue(lu.REQUIRED_KEYS <= entry.keys(), f"rank {rank}: {entry}")
        r0, r1 = logs
        # The epochs read by each step's end: 2 ranks x 4 windows a step, of the 4095 windows of
        # 64 that hold the synthetic corpus's 262144 tokens once.
        for a, b in zip(r0, r1):
            self.assertAlmostEqual(a["epoch"], (a["step"] + 1) * 8 / 4095, delta=1e-12)
            self.assertEqual(a["epoch"], b["epoch"])

        # One decision for all ranks, from one reduced flag and one reduced loss.
        for a, b in zip(r0, r1):
            for key in ("mean_loss", "loss_scale", "overflow", "grad_norm", "lr"):
                self.assertEqual(a[key], b[key], f"step {a['step']}: {key}")
        self.assertNotEqual(r0[0]["loss"], r1[0]["loss"], "the ranks must see different data")
        self.assertEqual([e["step"] for e in r0 if e["overflow"]], [7])
        # Found on rank 1, named on both.
        self.assertEqual(r1[7]["skipped_param"], "wte")
        self.assertEqual(r0[7]["skipped_param"], "wte")
        self.assertIsNone(r0[7]["grad_norm"], "no norm of non-finite gradients")
        self.assertIn("skipped: non-finite gradients", result.stderr)

        first = r0[0]["mean_loss"]
        last = sum(e["mean_loss"] for e in r0[-10:]) / 10
        self.assertAlmostEqual(first, math.log(256), delta=0.3)
        self.assertLess(last, first - 1.5, f"loss {first:.3f} -> {last:.3f}")

        with open(os.path.join(run, "config.pbtxt")) as f:
            self.assertIn("inject_nonfinite_steps: 7", f.read())
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), "step_00000060")
        # Without ZeRO the ranks share the writing of their common replica: half of each
        # buffer (masters, adam_m, adam_v; FP32 of the manifest's size) each, the halves
        # differing by at most an element.
        saved = os.path.join(run, "checkpoints", "step_00000060")
        sizes = [os.path.getsize(os.path.join(saved, f"rank_{r:05d}.bin")) for r in range(RANKS)]
        self.assertLessEqual(max(sizes) - min(sizes), 3 * 4, sizes)
        self.assertEqual(sum(sizes), 3 * 4 * lu.checkpoint_buffer_numel(saved), sizes)
        self.assertRegex(result.stderr, r"step 60/60 \| loss \d+\.\d+ \| scale 1 \| lr ")

        self.interrupt_and_resume("interrupted", logs)
        self.resume_on_other_world_size("full", logs, 1)
        # On 4 ranks each reads a quarter, across the 2-rank parts, and the ranks all-gather.
        self.resume_on_other_world_size("full", logs, 4)

    def test_a_step_waits_for_the_host_once(self):
        """A whole step of 2 ranks, gradient sync and ZeRO-1's all-gather included, synchronises
        with the host once, in FP8 as in BF16 (issue 13 allows FP8 two), however many buckets:
        FP8 gradient reduction derives each bucket's shared scale on the device (its amax goes to
        the collective and comes back without a host read), FP8 operands' scales come from their
        amaxes on the device (every recipe), and the buckets' non-finite checks come back with
        the step's own scalars. The first step is left out (it may build caches)."""
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        for mode, recipe, reduce, zero in (("BF16", "DELAYED", "BF16", 0),
                                           ("BF16", "DELAYED", "FP8_E4M3", 0),
                                           ("FP8_HYBRID", "DELAYED", "FP8_E4M3", 0),
                                           ("FP8_HYBRID", "CURRENT", "BF16", 0),
                                           ("FP8_HYBRID", "ROWWISE", "BF16", 0),
                                           ("BF16", "DELAYED", "BF16", 1)):
            run = self.run_dir(f"{mode}_{recipe}_{reduce}_{zero}")
            result = self.mantissa("train", "--config", config, "--set", f"run.dir={run}",
                                   "--set", "run.steps=8", "--set", "optimizer.warmup_steps=2",
                                   "--set", "checkpoint.every_steps=0",
                                   "--set", f"precision.mode={mode}",
                                   "--set", f"precision.fp8.recipe={recipe}",
                                   "--set", f"dist.grad_reduce_dtype={reduce}",
                                   "--set", f"dist.zero_stage={zero}",
                                   "--set", "dist.bucket_mb=0.05", ranks=RANKS)
            self.assertEqual(result.returncode, 0, result.stderr)
            for rank in range(RANKS):
                syncs = [e["host_syncs"] for e in lu.read_log(run, rank)][1:]
                self.assertEqual(len(syncs), 7, f"{mode} {recipe}: the log of rank {rank}")
                self.assertEqual(max(syncs), 1,
                                 f"{mode} {recipe}, {reduce} reduce, ZeRO-{zero}: {syncs}")

    def interrupt_and_resume(self, name, uninterrupted, *sets):
        """Runs train_args(name, *sets) under mpirun, stops it with SIGUSR1 sent to rank 1
        alone (mpirun would forward it to all) once 10 steps are logged, runs the same command
        again, and compares the logs with those of the `uninterrupted` run."""
        args = self.train_args(name, *sets)
        run = self.run_dir(name)
        process = self.start(*args, ranks=RANKS)
        try:
            lu.wait_for_lines(os.path.join(run, "log", "rank0.jsonl"), 10, process)
            pids = lu.rank_pids(process.pid)
            self.assertEqual(sorted(pids), list(range(RANKS)))
            os.kill(pids[1], signal.SIGUSR1)
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn("stop requested", stderr)
        # Every rank stopped after the same step, with one checkpoint.
        partial = [lu.read_log(run, r) for r in range(RANKS)]
        stopped = len(partial[0])
        self.assertEqual(len(partial[1]), stopped)
        self.assertLess(stopped, 60, "the run ended before the signal arrived")
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), f"step_{stopped:08d}")

        # The same command resumes after the last step done and finishes like the full run.
        result = self.mantissa(*args, ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"resumed from {run}/checkpoints/step_{stopped:08d}", result.stderr)
        resumed = [lu.read_log(run, r) for r in range(RANKS)]
        self.assertEqual(resumed[0][stopped]["step"], stopped)
        for rank in range(RANKS):
            self.assert_same_trajectory(resumed[rank], uninterrupted[rank])

    def resume_on_other_world_size(self, name, uninterrupted, ranks, *sets):
        """Resumes the step-20 checkpoint of the 2-rank run `name` on `ranks` ranks (alone for
        1) with the same global batch, hence the same data: close to the 2-rank trajectory but
        not identical, since the gradients are summed over another number of ranks (in BF16)."""
        run_name = f"{name}_on_{ranks}"
        run = self.run_dir(run_name)
        shutil.copytree(os.path.join(self.run_dir(name), "checkpoints", "step_00000020"),
                        os.path.join(run, "checkpoints", "step_00000020"))
        with open(os.path.join(run, "checkpoints", "latest"), "w") as f:
            f.write("step_00000020\n")
        args = self.train_args(run_name, f"data.micro_batch_size={8 // ranks}", *sets,
                               inject_rank=0)
        result = self.mantissa(*args, ranks=ranks if ranks > 1 else 0)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"resumed from {run}/checkpoints/step_00000020 (saved by 2 ranks)",
                      result.stderr)
        self.assertNotIn("the global batch changes", result.stderr)
        log = lu.read_log(run, 0)
        self.assertEqual([e["step"] for e in log], list(range(20, 60)))
        reference = uninterrupted[0][20:]
        self.assertEqual([e["loss_scale"] for e in log], [e["loss_scale"] for e in reference])
        worst = max(abs(a["mean_loss"] - b["mean_loss"]) / b["mean_loss"]
                    for a, b in zip(log, reference))
        print(f"2-rank checkpoint {' '.join(sets) or '(ZeRO-0)'} resumed on {ranks} rank(s): "
              f"largest relative difference of the mean loss over steps 20-59: {worst:.2e}")
        self.assertLess(worst, 1e-2)

    def test_another_global_batch_on_resume_is_noted(self):
        # TINY_GPT: 4 sequences per rank per step; saved by 2 ranks, resumed on 1.
        config = self.write("tiny.pbtxt", lu.TINY_GPT)

        def train(steps, ranks, *sets):
            return self.mantissa("train", "--config", config, "--set",
                                 f"run.dir={self.run_dir('batch')}", "--set", f"run.steps={steps}",
                                 "--set", "optimizer.warmup_steps=0", *sets, ranks=ranks)

        result = train(2, 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        # A weights file to start from is of no use to a resumed run: not read (this one is no
        # llm.c file), and said to have no effect.
        weights = self.write("weights.bin", "not read")
        result = train(3, 0, "--set", f"model.init_from={weights}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: settings changed since the checkpoint (checkpoint -> this run):\n"
                      "  run.steps 2 -> 3\n"
                      f"  model.init_from \"\" -> \"{weights}\" (no effect: it only starts a run)\n",
                      result.stderr)
        self.assertIn("mantissa: note: the global batch changes from 8 to 4 sequences per step",
                      result.stderr)
        # run.steps 2 -> 3 stretches the cosine: step 3 takes lr_min + (lr - lr_min) / 4
        # (0.003 peak, 0.1 floor) where the checkpoint's schedule had ended at lr_min.
        self.assertIn("mantissa: note: the learning rate of step 3 is 0.000975 under this "
                      "config's schedule (0.0003 under the checkpoint's)", result.stderr)

    def test_ranks_free_to_share_cpus_divide_them(self):
        # Two ranks that mpirun does not bind may both run on every CPU of this machine: without
        # OMP_NUM_THREADS each takes half (OpenMP's own default was all of them, in each rank).
        # One rank bound to a core is told of the CPUs left idle. An OMP_NUM_THREADS past the
        # share is kept, and the host warned of, once.
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        cpus = len(os.sched_getaffinity(0))
        env = {k: v for k, v in lu.environment().items() if k != "OMP_NUM_THREADS"}

        def train(name, *mpirun_args, ranks=2, bind=("--bind-to", "none")):
            command = ["mpirun", "--oversubscribe", "-np", str(ranks), *bind, *mpirun_args,
                       lu.binary(), "train", "--config", config, "--set", "run.steps=2",
                       "--set", f"run.dir={self.run_dir(name)}"]
            result = subprocess.run(command, cwd=self.dir, env=env, timeout=120,
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            return result.stderr

        share = max(1, cpus // 2)
        stderr = train("share")
        self.assertIn(f"CPU ({share} thread{'s' if share > 1 else ''})", stderr)
        self.assertIn(f"a nominal 96 per CPU x {share} (metrics.peak_tflops", stderr)
        self.assertNotIn("warning", stderr)
        self.assertNotIn("note: host", stderr)

        # One rank, which mpirun binds to one core, is told of the CPUs it leaves idle.
        stderr = train("bound", ranks=1, bind=())
        self.assertIn("CPU (1 thread)", stderr)
        if cpus > 1:
            self.assertIn(f"its rank may run on 1 of the {cpus} CPUs mpirun may use", stderr)
            # Unless the CPU was chosen with --cpu-set.
            stderr = train("chosen", "--cpu-set", "0", ranks=1, bind=())
            self.assertIn("CPU (1 thread)", stderr)
            self.assertNotIn("note: host", stderr)

        threads = max(2, cpus)
        stderr = train("asked", "-x", f"OMP_NUM_THREADS={threads}")
        self.assertIn(f"CPU ({threads} threads)", stderr)
        self.assertEqual(stderr.count(f"warning: OMP_NUM_THREADS='{threads}': host "), 1, stderr)
        self.assertIn(f"its 2 ranks run {threads} threads each on the {cpus} CPU", stderr)
        self.assertIn(f"({share} thread{'s' if share > 1 else ''} here)", stderr)
        # MFU's peak counts the CPUs the threads take turns on, not the threads.
        self.assertIn(f"MFU against {96 * share:g} GFLOP/s per rank, a nominal 96 per CPU x "
                      f"{share} (its {threads} threads take turns)", stderr)

        # A value OpenMP ignores is said to be ignored, and the share taken.
        stderr = train("ignored", "-x", "OMP_NUM_THREADS=all")
        self.assertIn(f"CPU ({share} thread{'s' if share > 1 else ''})", stderr)
        self.assertEqual(stderr.count("OMP_NUM_THREADS='all' is not a thread count"), 1, stderr)

        # Under OpenMP's places the main thread is bound to the first place as the process
        # starts; a rank still takes the CPUs of all places (1 CPU, read off the main thread).
        stderr = train("places", "-x", "OMP_PLACES=threads", ranks=1)
        self.assertIn(f"CPU ({cpus} thread{'s' if cpus > 1 else ''})", stderr)

    def exported_weights(self, name):
        """`mantissa export` of run `name`'s newest checkpoint: (its safetensors header without
        the metadata, which names the run directory, and its tensor bytes)."""
        out = os.path.join(self.dir, f"{name}.safetensors")
        result = self.mantissa("export", "--config", self.write("tiny.pbtxt", lu.TINY_GPT),
                               "--set", f"run.dir={self.run_dir(name)}", "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(out, "rb") as f:
            data = f.read()
        header_len = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + header_len])
        del header["__metadata__"]
        return header, data[8 + header_len:]

    def test_zero1_interrupted_and_resumed(self):
        # Under ZeRO-1 each rank keeps and checkpoints only its own shard of masters and
        # moments; the checkpoint resumes on any number of ranks, each loading its new shard.
        result = self.mantissa(*self.train_args("zero1", "dist.zero_stage=1"), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        logs = [lu.read_log(self.run_dir("zero1"), r) for r in range(RANKS)]
        self.assertLess(logs[0][-1]["mean_loss"], logs[0][0]["mean_loss"] - 1.5)
        self.interrupt_and_resume("zero1_interrupted", logs, "dist.zero_stage=1")
        # The shards of the final checkpoints, stitched by `mantissa export`: the same weights
        # to the bit with and without the interruption.
        exported = [self.exported_weights(name) for name in ("zero1", "zero1_interrupted")]
        self.assertEqual(exported[0][0], exported[1][0])
        self.assertTrue(exported[0][1] == exported[1][1], "the exported weights differ")
        for ranks in (1, 4):
            self.resume_on_other_world_size("zero1", logs, ranks, "dist.zero_stage=1")

    def test_zero1_shards_move_to_an_odd_number_of_ranks(self):
        # ZeRO-1's shards are aligned blocks (train/parameters.cpp split_aligned), which 3 ranks
        # cut at other places than 2: a 2-rank checkpoint loads on 3 ranks, which train a step
        # at learning rate 0 and save their own shards, and the weights `mantissa export`
        # stitches from those are the 2-rank checkpoint's, to the bit.
        result = self.mantissa(*self.train_args("two", "dist.zero_stage=1", "run.steps=20",
                                                inject_rank=0), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        shutil.copytree(os.path.join(self.run_dir("two"), "checkpoints"),
                        os.path.join(self.run_dir("three"), "checkpoints"))
        result = self.mantissa(*self.train_args("three", "dist.zero_stage=1", "run.steps=21",
                                                "optimizer.adamw.lr=0", inject_rank=0), ranks=3)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("(saved by 2 ranks)", result.stderr)
        saved = os.path.join(self.run_dir("three"), "checkpoints", "step_00000021")
        self.assertEqual(sorted(n for n in os.listdir(saved) if n.endswith(".bin")),
                         [f"rank_{r:05d}.bin" for r in range(3)])
        self.assertTrue(self.exported_weights("two")[1] == self.exported_weights("three")[1],
                        "the weights moved")

    def test_sigterm_and_sigint_stop_a_single_rank_with_a_checkpoint(self):
        # SIGTERM (a scheduler) and SIGHUP (a dropped ssh session) exit 0; SIGINT (Ctrl-C)
        # exits 130, the shell's code for an interrupted program, after the same checkpoint,
        # also when a SIGTERM comes in the same step (a wrapper would requeue an exit 0): steps
        # of about 0.3 s there, the SIGTERM 20 ms after the SIGINT.
        slow = ("model.gpt2.n_embd=512", "model.gpt2.n_layer=4")
        for name, signals, code, sets in (("alone", [signal.SIGTERM], 0, ()),
                                          ("hangup", [signal.SIGHUP], 0, ()),
                                          ("ctrl_c", [signal.SIGINT], 130, ()),
                                          ("ctrl_c_term", [signal.SIGINT, signal.SIGTERM], 130,
                                           slow)):
            sig = signals[0]
            process = self.start(*self.train_args(name, "run.steps=2000", *sets, inject_rank=0))
            try:
                run = self.run_dir(name)
                lu.wait_for_lines(os.path.join(run, "log", "rank0.jsonl"), 5, process)
                for each in signals:
                    process.send_signal(each)
                    time.sleep(0.02)
                stdout, stderr = process.communicate(timeout=120)
            finally:
                if process.poll() is None:
                    process.kill()
            self.assertEqual(process.returncode, code, stderr)
            stopped = len(lu.read_log(run, 0))
            with open(os.path.join(run, "checkpoints", "latest")) as f:
                self.assertEqual(f.read().strip(), f"step_{stopped:08d}")
            self.assertIn(f"stopped after step {stopped}/2000 with a checkpoint", stderr)
            if sig == signal.SIGINT:
                self.assertIn("interrupted: stopping after this step with a checkpoint", stderr)
                self.assertIn("interrupted (SIGINT)", stderr)

    def test_a_run_started_under_nohup_keeps_running_on_sighup(self):
        # nohup's ignored SIGHUP stays ignored: the run outlives its terminal, and stops on
        # the SIGTERM that follows.
        process = subprocess.Popen(
            [lu.binary(), *self.train_args("nohup", "run.steps=2000", inject_rank=0)],
            cwd=self.dir, env=lu.environment(), text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        try:
            log = os.path.join(self.run_dir("nohup"), "log", "rank0.jsonl")
            lu.wait_for_lines(log, 3, process)
            with open(f"/proc/{process.pid}/status") as f:
                status = dict(line.split(":\t", 1) for line in f.read().splitlines())
            self.assertTrue(int(status["SigIgn"], 16) & (1 << (signal.SIGHUP - 1)), status)
            self.assertTrue(int(status["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)), status)
            process.send_signal(signal.SIGHUP)
            lu.wait_for_lines(log, lu.count_lines(log) + 5, process)
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn("with a checkpoint", stderr)

    def start_held_at_its_start(self, args):
        """Starts mantissa alone with its stdout a full pipe: the effective config, printed after
        the signal handlers are set and before the setup, holds the run there. Returns (process,
        the pipe's read end) once the kernel shows it waiting in the pipe's write."""
        read_end, write_end = os.pipe()
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
        os.write(write_end, b"#" * fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ))
        process = subprocess.Popen([lu.binary(), *args], cwd=self.dir, env=lu.environment(),
                                   text=True, stdout=write_end, stderr=subprocess.PIPE)
        os.close(write_end)
        deadline = time.monotonic() + 60
        while "pipe_write" not in waiting_in(process.pid):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"the run was not seen writing its stdout (exit "
                                     f"{process.poll()}, /proc wchan {waiting_in(process.pid)!r})")
            time.sleep(0.01)
        return process, read_end

    def test_a_stop_during_the_start_ends_the_run_before_its_first_step(self):
        # A preemption while the data or a checkpoint loads: no step and no save, which would
        # only spend the grace period. Fresh (SIGTERM, exit 0: no checkpoint) and resumed from
        # step 20 (SIGINT, exit 130: that checkpoint stays the newest, the log unchanged).
        first = self.mantissa(*self.train_args("resumed", "run.steps=20", inject_rank=0))
        self.assertEqual(first.returncode, 0, first.stderr)
        for name, sig, code, words in (
                ("fresh", signal.SIGTERM, 0,
                 "stop requested (SIGUSR1/SIGTERM/SIGHUP) during the start: stopped before step "
                 "1/2000; no checkpoint yet"),
                ("resumed", signal.SIGINT, 130,
                 "interrupted (SIGINT) during the start: stopped before step 21/2000; the "
                 "checkpoint of step 20 stays the newest")):
            process, stdout = self.start_held_at_its_start(
                self.train_args(name, "run.steps=2000", inject_rank=0))
            try:
                process.send_signal(sig)
                with os.fdopen(stdout, "rb") as pipe:
                    reader = threading.Thread(target=pipe.read)
                    reader.start()
                    _, stderr = process.communicate(timeout=120)
                    reader.join()
            finally:
                if process.poll() is None:
                    process.kill()
            self.assertEqual(process.returncode, code, stderr)
            self.assertIn(words, stderr)
            if sig == signal.SIGINT:
                # Ctrl-C's own note promises no checkpoint the start will not write.
                self.assertIn("mantissa: interrupted: stopping once the start is done, before "
                              "the first step (Ctrl-C again to quit at once)\n", stderr)
                self.assertNotIn("stopping after this step", stderr)
            run = self.run_dir(name)
            latest = os.path.join(run, "checkpoints", "latest")
            if name == "fresh":
                self.assertFalse(os.path.exists(latest))
            else:
                with open(latest) as f:
                    self.assertEqual(f.read().strip(), "step_00000020")
                self.assertEqual(len(lu.read_log(run, 0)), 20)

    def signal_during_a_save(self, process, checkpoints, sig):
        """Catches the rank inside a save: paused (SIGSTOP) once a temporary step directory is
        there, and, if it still is, sent `sig` and resumed. Returns the step being saved."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
            unfinished = [n for n in names if re.fullmatch(r"step_\d+\.tmp", n)]
            if not unfinished:
                time.sleep(0.005)
                continue
            process.send_signal(signal.SIGSTOP)
            saving = None
            if os.path.exists(os.path.join(checkpoints, unfinished[0])):
                saving = int(unfinished[0][len("step_"):-len(".tmp")])
                process.send_signal(sig)
            process.send_signal(signal.SIGCONT)
            if saving is not None:
                return saving
        self.fail("no save caught in progress within 60 s")

    def test_a_stop_during_a_save_ends_the_run_on_it(self):
        # A stop asked for while a checkpoint is written ends the run on that checkpoint, not
        # after one more step and one more save. A large embedding makes each save take a while.
        name = "mid_save"
        process = self.start(*self.train_args(
            name, "run.steps=2000", "checkpoint.every_steps=1",
            "model.gpt2.vocab_size=65536", inject_rank=0))
        try:
            saving = self.signal_during_a_save(
                process, os.path.join(self.run_dir(name), "checkpoints"), signal.SIGTERM)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn(f"stopped after step {saving}/2000 with a checkpoint", stderr)
        self.assertEqual(len(lu.read_log(self.run_dir(name), 0)), saving)

    def test_ctrl_c_during_a_stops_save_exits_130(self):
        # SIGTERM asks for the stop; a Ctrl-C while its checkpoint is written makes the exit
        # code 130 (a wrapper would requeue an exit 0), and the run still ends on that save.
        name = "ctrl_c_mid_save"
        process = self.start(*self.train_args(
            name, "run.steps=2000", "checkpoint.every_steps=0",
            "model.gpt2.vocab_size=65536", inject_rank=0))
        try:
            lu.wait_for_lines(os.path.join(self.run_dir(name), "log", "rank0.jsonl"), 3, process)
            process.send_signal(signal.SIGTERM)
            saving = self.signal_during_a_save(
                process, os.path.join(self.run_dir(name), "checkpoints"), signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 130, stderr)
        self.assertIn(f"interrupted (SIGINT): stopped after step {saving}/2000 with a "
                      "checkpoint", stderr)
        self.assertEqual(len(lu.read_log(self.run_dir(name), 0)), saving)

    def stop_through_wrapper(self, name, sig, ready, mpirun_args=(), env=None):
        """A 2000-step run of 2 ranks through deploy/mantissa-mpirun, in a session of its own
        (as a terminal's foreground group), sent `sig` as a group once ready(process, run dir)
        returns; returns (exit code, stderr, steps logged by rank 0: 0 without a log)."""
        wrapper = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        run = self.run_dir(name)
        command = [wrapper, *mpirun_args, *lu.mpirun_prefix(RANKS)[1:], lu.binary(),
                   *self.train_args(name, "run.steps=2000", inject_rank=0)]
        process = subprocess.Popen(command, cwd=self.dir, env={**lu.environment(), **(env or {})},
                                   text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        try:
            ready(process, run)
            os.killpg(process.pid, sig)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        # No log when the job ended before its first step: the exit code and stderr tell why.
        logged = os.path.exists(os.path.join(run, "log", "rank0.jsonl"))
        return process.returncode, stderr, len(lu.read_log(run, 0)) if logged else 0

    def test_ctrl_c_on_mantissa_mpirun_shows_the_stop(self):
        # Ctrl-C at a terminal signals the foreground process group: deploy/mantissa-mpirun and
        # its stderr filter. The wrapper turns it into SIGUSR1 to mpirun (in a session of its
        # own), which forwards it and waits, the ranks stop with a checkpoint, their last words
        # still come through the filter, and the wrapper exits 130. mpirun's own answer to
        # SIGINT, SIGTERM to the ranks and SIGKILL odls_base_sigkill_timeout later, is set to
        # kill at once here: passed on, it would leave no checkpoint.
        code, stderr, stopped = self.stop_through_wrapper(
            "ctrl_c_wrapper", signal.SIGINT,
            lambda process, run: lu.wait_for_lines(os.path.join(run, "log", "rank0.jsonl"), 5,
                                                   process),
            mpirun_args=("--mca", "odls_base_sigkill_timeout", "0"))
        self.assertEqual(code, 130, stderr)
        self.assertIn("mantissa-mpirun: SIGINT: asking the ranks to checkpoint and stop", stderr)
        with open(os.path.join(self.run_dir("ctrl_c_wrapper"), "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), f"step_{stopped:08d}")
        self.assertIn(f"stopped after step {stopped}/2000 with a checkpoint", stderr)

    def test_a_stop_before_the_ranks_are_up_waits_for_them(self):
        # mpirun drops a SIGUSR1 that comes before it has started the ranks (the job would run
        # on to the end), and a rank whose handler is not set yet dies of it. The wrapper keeps
        # a stop asked for while the job is starting until a rank has printed a line, then
        # sends it, however long the start takes: here mpirun is slow to start (6 s), as over
        # ssh to many hosts, and SIGTERM comes in that time. The ranks stop after their first
        # steps with a checkpoint, exit 0. (The wrapper used to give up waiting after 5 s and
        # send the USR1 anyway: it ended the start, here the script that runs mpirun.)
        slow_mpirun = self.write(
            "slow-mpirun", f'#!/bin/sh\nsleep 6\nexec {lu.mpirun_prefix(RANKS)[0]} "$@"\n')
        os.chmod(slow_mpirun, 0o755)
        code, stderr, stopped = self.stop_through_wrapper(
            "early_stop", signal.SIGTERM, lambda process, run: time.sleep(1),
            env={"MPIRUN": slow_mpirun})
        self.assertEqual(code, 0, stderr)
        self.assertIn("(SIGUSR1 to mpirun, once they have started)", stderr)
        self.assertLess(stopped, 2000)
        self.assertIn(f"stopped after step {stopped}/2000 with a checkpoint", stderr)

    def test_a_rank_that_never_starts_ends_the_job_at_the_start_timeout(self):
        # The second process of the job never calls MPI_Init: the first waited in it for ever.
        # With a start timeout of 2 s it ends the job with exit code 3, saying why.
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        result = subprocess.run(
            ["mpirun", "--oversubscribe", "-x", "MANTISSA_MPI_START_TIMEOUT_S", "-np", "1",
             lu.binary(), "train", "--config", config, "--set", f"run.dir={self.run_dir('x')}",
             ":", "-np", "1", "sleep", "120"],
            cwd=self.dir, env=lu.environment(MANTISSA_MPI_START_TIMEOUT_S="2"), timeout=90,
            capture_output=True, text=True)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertRegex(result.stderr, r"mantissa: rank 0 \(host [^)]+\): the MPI start "
                         r"\(MPI_Init, and every rank's host gathered\) did not finish within "
                         r"2 s \(MANTISSA_MPI_START_TIMEOUT_S\)")
        self.assertFalse(os.path.exists(self.run_dir("x")), "nothing may be written")

    def test_a_rank_held_before_the_mpi_end_ends_the_job_at_the_timeout(self):
        # Rank 1 is held before MPI_Finalize (as a rank stopped after the last collective is):
        # rank 0 waited in its own for ever. With a bound of 10 s (which MPI_Init must also
        # keep, on a busy machine too) it ends the job with exit code 3, saying why, after the
        # run's work is done and saved. Rank 1 itself has no bound: its own watchdog would
        # otherwise end it at the same moment (the shim holds it inside MPI_Finalize), and
        # Open MPI's mpirun can crash when both ranks end that way at once.
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        shim = os.path.join(os.path.dirname(lu.binary()), "hold_finalize.so")
        per_rank = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then MANTISSA_MPI_START_TIMEOUT_S=0; fi; '
                    f'LD_PRELOAD={shim} exec "$0" "$@"')
        result = subprocess.run(
            ["mpirun", "--oversubscribe", "-x", "MANTISSA_MPI_START_TIMEOUT_S", "-x",
             "HOLD_FINALIZE_RANK=1", "-x", "HOLD_FINALIZE_S=60", "-np", "2", "sh", "-c",
             per_rank, lu.binary(), "train", "--config", config, "--set",
             f"run.dir={self.run_dir('held')}"],
            cwd=self.dir, env=lu.environment(MANTISSA_MPI_START_TIMEOUT_S="10"), timeout=90,
            capture_output=True, text=True)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertRegex(result.stderr, r"mantissa: rank 0 \(host [^)]+\): the MPI end "
                         r"\(MPI_Finalize, which waits for every rank\) did not finish within "
                         r"10 s \(MANTISSA_MPI_START_TIMEOUT_S\): a rank of the job stopped "
                         r"answering after this rank's work had ended")
        self.assertNotIn("mantissa: rank 1 (host", result.stderr)
        self.assertIn("mantissa: done", result.stderr)
        with open(os.path.join(self.run_dir("held"), "checkpoints", "latest")) as f:
            self.assertTrue(f.read().startswith("step_"))

    def test_a_step_log_that_cannot_be_written_stops_the_run_with_a_checkpoint(self):
        # Rank 1's log fails at its 5th line (step 5) as on a full disk: the ranks stop after
        # the next step with a checkpoint, exit 1 saying why, and the same command continues.
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        shim = os.path.join(os.path.dirname(lu.binary()), "fail_step_log.so")
        run = self.run_dir("log_full")
        command = ["mpirun", "--oversubscribe", "-np", "2", lu.binary(), "train", "--config",
                   config, "--set", f"run.dir={run}"]
        result = subprocess.run(
            command[:2] + ["-x", f"LD_PRELOAD={shim}", "-x", "FAIL_STEP_LOG=/log/rank1.jsonl",
                           "-x", "FAIL_STEP_LOG_AFTER=5"] + command[2:],
            cwd=self.dir, env=lu.environment(), timeout=300, capture_output=True, text=True)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"mantissa: rank 1: cannot write log '[^']*/log/"
                         r"rank1\.jsonl': No space left on device; no more is written to it, "
                         r"and the run stops with a checkpoint")
        self.assertRegex(result.stderr, r"mantissa: a rank's step log could not be written "
                         r"\(above\): stopped after step 6\b")
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), "step_00000006")
        with open(os.path.join(run, "log", "rank0.jsonl")) as f:
            self.assertEqual(len(f.readlines()), 6)
        result = subprocess.run(command + ["--set", "run.steps=8"], cwd=self.dir,
                                env=lu.environment(), timeout=300, capture_output=True,
                                text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("resumed at step 6", result.stderr)
        # The log fails one step before the end: the evaluation after the last step still runs
        # (only a signal's stop cuts it short), the run ends with its final checkpoint, exit 1.
        shutil.rmtree(run)
        result = subprocess.run(
            command[:2] + ["-x", f"LD_PRELOAD={shim}", "-x", "FAIL_STEP_LOG=/log/rank1.jsonl",
                           "-x", "FAIL_STEP_LOG_AFTER=5"] + command[2:] +
            ["--set", "run.steps=6", "--set", "run.eval_every=3"],
            cwd=self.dir, env=lu.environment(), timeout=300, capture_output=True, text=True)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("mantissa: done, 6 steps", result.stderr)
        with open(os.path.join(run, "log", "rank0.jsonl")) as f:
            self.assertIn("val_loss", json.loads(f.readlines()[-1]))
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), "step_00000006")

    def test_a_resumed_run_shows_its_checkpoint_and_step_at_once(self):
        # Before it saves, a resumed run's exporter shows the checkpoint it resumed from (step
        # and save time), the run's absolute step, and the validation loss as the checkpoint
        # recorded it (the first run evaluates, this one not before it is killed), not nothing.
        # A dynamic loss scale whose floor, 0.1, a float does not hold exactly.
        scaling = ("precision.loss_scale.mode=DYNAMIC", "precision.loss_scale.min=0.1")
        result = self.mantissa(*self.train_args("resumed", "run.steps=10", "run.eval_every=5",
                                                *scaling, inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        run = self.run_dir("resumed")
        # Seconds between the save and the resume, so that a time the resume took for the
        # save's (its own start, a scrape's) shows.
        time.sleep(2)
        resume_started = time.time()
        process = self.start(*self.train_args("resumed", "run.steps=100000", *scaling,
                                              "checkpoint.every_steps=0", f"metrics.port={port}",
                                              "run.eval_every=100000", inject_rank=0))
        try:
            # The first run's 10 lines, and 10 of this one.
            lu.wait_for_lines(os.path.join(run, "log", "rank0.jsonl"), 20, process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        finally:
            process.kill()
            _, stderr = process.communicate()
        # The start says where to scrape.
        self.assertIn(f"mantissa: metrics at http://127.0.0.1:{port}/metrics\n", stderr)
        values = dict(re.findall(r'^(mantissa_\w+)\{rank="0"\} (\S+)$', text, re.MULTILINE))
        self.assertEqual(values.get("mantissa_last_checkpoint_step"), "10", text)
        saved_at = float(values.get("mantissa_last_checkpoint_timestamp_seconds", 0))
        self.assertLess(abs(saved_at - os.path.getmtime(os.path.join(
            run, "checkpoints", "step_00000010", "manifest.pb"))), 1)
        self.assertLess(saved_at, resume_started - 1.5)
        self.assertEqual(values.get("mantissa_run_steps"), "100000")
        # Absolute: this process alone has done about 10 steps.
        self.assertGreaterEqual(float(values.get("mantissa_step", 0)), 19)
        evaluations = [e["val_loss"] for e in lu.read_log(run, 0)[:10] if "val_loss" in e]
        self.assertEqual(len(evaluations), 2)
        self.assertAlmostEqual(float(values.get("mantissa_val_loss", "nan")), evaluations[1],
                               delta=1e-6 * evaluations[1])
        self.assertEqual(values.get("mantissa_val_loss_rises"),
                         "1" if evaluations[1] > evaluations[0] else "0")
        # The floor as the scaler holds it (a float), so that the collapse alert's
        # `mantissa_loss_scale <= mantissa_loss_scale_min` holds at the floor: the text a scale
        # at the floor would show (prometheus-cpp writes 16 significant digits), not 0.1.
        float_min = struct.unpack("<f", struct.pack("<f", 0.1))[0]
        self.assertEqual(values.get("mantissa_loss_scale_min"), f"{float_min:.16g}", text)

    def test_the_validation_trend_goes_on_only_over_the_same_validation_tokens(self):
        # The checkpoint of step 10 is made to say that 5 evaluations in a row rose up to a
        # validation loss of 0. A resume that evaluates the same tokens counts on (the loss at
        # step 15 is higher: 6); one that evaluates fewer tokens says so and starts over (0).
        first = self.mantissa(*self.train_args("trend", "run.steps=10", "run.eval_every=5",
                                                 inject_rank=0))
        self.assertEqual(first.returncode, 0, first.stderr)
        step10 = os.path.join(self.run_dir("trend"), "checkpoints", "step_00000010")
        text = lu.decode_manifest(step10)
        self.assertRegex(text, r"\nvalidation_key: [1-9]")
        text = re.sub(r"\nlast_val_loss: \S+", "\nlast_val_loss: 0", text)
        text = re.sub(r"\nval_loss_rises: \d+", "", text) + "\nval_loss_rises: 5\n"
        lu.write_manifest(step10, text)
        shutil.copytree(self.run_dir("trend"), self.run_dir("other_tokens"))

        rises, keys = {}, {}
        for name, sets in (("trend", ()), ("other_tokens", ("run.eval_tokens=4096",))):
            result = self.mantissa(*self.train_args(name, "run.steps=15", "run.eval_every=5",
                                                    *sets, inject_rank=0))
            self.assertEqual(result.returncode, 0, result.stderr)
            starts_over = "mantissa_val_loss_rises counts from this run's first evaluation"
            self.assertEqual(starts_over in result.stderr, name == "other_tokens",
                             result.stderr)
            saved = lu.decode_manifest(os.path.join(self.run_dir(name), "checkpoints",
                                                    "step_00000015"))
            found = re.search(r"\nval_loss_rises: (\d+)", saved)
            rises[name] = int(found.group(1)) if found else 0
            keys[name] = re.search(r"\nvalidation_key: (\d+)", saved).group(1)
        self.assertEqual(rises, {"trend": 6, "other_tokens": 0})
        self.assertNotEqual(keys["trend"], keys["other_tokens"])

    def checkpoint_of_an_earlier_build(self, setting, copy):
        """Runs "older" for 10 steps and removes `setting` (a regex of one line of the config
        text) from the config its checkpoint recorded, as a build before that setting wrote
        it; then copies the run to `copy`."""
        first = self.mantissa(*self.train_args("older", "run.steps=10", inject_rank=0))
        self.assertEqual(first.returncode, 0, first.stderr)
        step10 = os.path.join(self.run_dir("older"), "checkpoints", "step_00000010")
        text, removed = re.subn(setting + r"\\n", "", lu.decode_manifest(step10))
        self.assertEqual(removed, 1, text)
        lu.write_manifest(step10, text)
        shutil.copytree(self.run_dir("older"), self.run_dir(copy))

    def test_a_checkpoint_of_an_earlier_build_names_the_settings_it_lacked(self):
        # A checkpoint records the effective config, every field set; one written before
        # run.eval_tokens existed lacks it, and the resume names it with the default it takes.
        self.checkpoint_of_an_earlier_build(r"  eval_tokens: \d+", "older_set")
        result = self.mantissa(*self.train_args("older", "run.steps=12", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        note = ("mantissa: note: an earlier build wrote the checkpoint, without these settings; "
                "this run takes them as run.eval_tokens = {} (that build may have behaved "
                "otherwise: --set one to keep the run as it was)")
        self.assertIn(note.format(16384), result.stderr)
        # Set on the resume: named with its value, and no change from a value the checkpoint
        # never held.
        result = self.mantissa(*self.train_args("older_set", "run.steps=12", "run.eval_tokens=64",
                                                inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(note.format(64), result.stderr)
        self.assertNotIn("run.eval_tokens 16384 -> 64", result.stderr)

    def test_a_checkpoint_from_before_data_sampling_is_told_how_to_continue(self):
        # A build before data.sampling drew windows as RANDOM does: a resume of its checkpoint
        # under the default EPOCHS warns that the stream changes and names the setting that
        # continues it, which then resumes without a word. A recorded sampling changed on
        # resume is warned about too.
        self.checkpoint_of_an_earlier_build("  sampling: EPOCHS", "older_random")
        warning = ("mantissa: warning: the checkpoint's run drew its windows with data.sampling "
                   "{}, this run reads {}: the data stream changes from here on")
        result = self.mantissa(*self.train_args("older", "run.steps=12", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(warning.format("RANDOM", "EPOCHS") + " (the earlier build that wrote the "
                      "checkpoint drew them as RANDOM does: --set data.sampling=RANDOM continues "
                      "its stream)\n", result.stderr)
        self.assertNotIn("data.sampling =", result.stderr)
        result = self.mantissa(*self.train_args("older_random", "run.steps=12",
                                                "data.sampling=RANDOM", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("sampling", result.stderr)
        result = self.mantissa(*self.train_args("older", "run.steps=14", "data.sampling=RANDOM",
                                                inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(warning.format("EPOCHS", "RANDOM") + "\n", result.stderr)

    def test_other_data_on_resume_starts_a_whole_epoch(self):
        # 10 steps on the synthetic corpus, then a text of 50 windows of 64 (3201 bytes): its
        # epochs count from the resume, so step 10 ends 4 of its 50 windows in (not wherever the
        # synthetic run's 40 windows would fall in its epochs), and the next checkpoint carries
        # that origin on.
        first = self.mantissa(*self.train_args("phases", "run.steps=10", inject_rank=0))
        self.assertEqual(first.returncode, 0, first.stderr)
        text = os.path.join(self.dir, "phase2.txt")
        with open(text, "w") as f:
            f.write("".join(chr(ord("a") + i % 26) for i in range(50 * 64 + 1)))
        data = f'data.text_file={{path: "{text}" val_fraction: 0}}'
        note = ("mantissa: the training data's epochs count from step {}: its tokens, its "
                "windows' length or their order (run.seed, data.sampling) differ from the "
                "checkpoint's\n")
        second = self.mantissa(*self.train_args("phases", "run.steps=12", data,
                                                "run.eval_every=0", inject_rank=0))
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn(note.format(10), second.stderr)
        third = self.mantissa(*self.train_args("phases", "run.steps=14", data,
                                               "run.eval_every=0", inject_rank=0))
        self.assertEqual(third.returncode, 0, third.stderr)
        self.assertNotIn("epochs count from", third.stderr)
        # Another seed keys another shuffle: a whole epoch again.
        fourth = self.mantissa(*self.train_args("phases", "run.steps=16", data,
                                                "run.eval_every=0", "run.seed=4", inject_rank=0))
        self.assertEqual(fourth.returncode, 0, fourth.stderr)
        self.assertIn(note.format(14), fourth.stderr)
        epochs = {e["step"]: e["epoch"] for e in lu.read_log(self.run_dir("phases"), 0)}
        self.assertEqual(epochs[9], 40 / 4095)
        for step in range(10, 14):
            self.assertAlmostEqual(epochs[step], (step - 9) * 4 / 50, delta=1e-12)
        for step in range(14, 16):
            self.assertAlmostEqual(epochs[step], (step - 13) * 4 / 50, delta=1e-12)

    def test_steps_redone_after_a_crash_are_logged_once(self):
        # A 2-rank run crashed after step 30 before its checkpoint was complete (its directory
        # removed), resumed on 1 rank: it redoes steps 20 to 29 from the checkpoint of step 20.
        # Each log keeps each step once, rank 1's included, which no rank appends to now; the
        # lines of the lost attempt move to rank<R>.rolled_back.jsonl in their order.
        run = self.run_dir("crash")
        result = self.mantissa(*self.train_args("crash", "run.steps=30",
                                                "checkpoint.every_steps=10", inject_rank=0),
                               ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        lost = [lu.read_log(run, rank)[20:] for rank in range(RANKS)]
        shutil.rmtree(os.path.join(run, "checkpoints", "step_00000030"))
        # A crash while config.pbtxt was replaced leaves its temporary; the next start clears it.
        leftover = os.path.join(run, "config.pbtxt.4242-0.tmp")
        with open(leftover, "w") as f:
            f.write("run { steps: 1 }\n")
        result = self.mantissa(*self.train_args("crash", "run.steps=33",
                                                "checkpoint.every_steps=10", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("checkpoints/step_00000020 (saved by 2 ranks)", result.stderr)
        self.assertFalse(os.path.exists(leftover))
        self.assertEqual([e["step"] for e in lu.read_log(run, 0)], list(range(33)))
        self.assertEqual([e["step"] for e in lu.read_log(run, 1)], list(range(20)))
        for rank in range(RANKS):
            with open(os.path.join(run, "log", f"rank{rank}.rolled_back.jsonl")) as f:
                self.assertEqual([json.loads(line) for line in f], lost[rank])

    def test_a_rolled_back_log_that_cannot_be_written_is_a_setting_to_fix(self):
        # The log's lost lines go to rank0.rolled_back.jsonl; a file there that cannot be made
        # (here a link into sysfs, which takes no new files, as a directory the user may not
        # write to) ends the start with exit 2, as rank0.jsonl itself does (it was 1).
        run = self.run_dir("unwritable")
        result = self.mantissa(*self.train_args("unwritable", "run.steps=10",
                                                "checkpoint.every_steps=5", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        shutil.rmtree(os.path.join(run, "checkpoints", "step_00000010"))
        rolled_back = os.path.join(run, "log", "rank0.rolled_back.jsonl")
        os.symlink("/sys/mantissa_rolled_back.jsonl", rolled_back)
        result = self.mantissa(*self.train_args("unwritable", "run.steps=10",
                                                "checkpoint.every_steps=5", inject_rank=0))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, re.escape(f"cannot open '{rolled_back}': ") +
                         "(Permission denied|Read-only file system)")

    def test_checkpoints_that_cannot_be_saved_are_refused_before_the_first_step(self):
        # run.dir's checkpoints/ a link into sysfs, which takes no new files (as a directory the
        # user may not write to): the first save, after checkpoint.every_steps steps of work,
        # would fail. The start says so, exit 2, before step 0.
        run = self.run_dir("unsavable")
        os.makedirs(run)
        os.symlink("/sys", os.path.join(run, "checkpoints"))
        result = self.mantissa(*self.train_args("unsavable", "run.steps=10", inject_rank=0))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, re.escape(
            f"mantissa: checkpoints (checked before the first step): cannot create a file in "
            f"'{run}/checkpoints': ") + "(Permission denied|Read-only file system)")
        self.assertFalse(os.path.exists(os.path.join(run, "log", "rank0.jsonl")))

    def test_llmc_weights_in_safetensors_out(self):
        # An llm.c GPT-2 file (version 3, FP32) with TINY_GPT's shapes: L=2, C=64, 2 heads,
        # max_seq_len 64, vocab 256 (no padding).
        L, C, T, V = 2, 64, 64, 256
        shapes = {"wte": (V, C), "wpe": (T, C), "ln1w": (L, C), "ln1b": (L, C),
                  "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C),
                  "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C),
                  "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,),
                  "lnfb": (C,)}
        rng = random.Random(7)
        tensors = {name: array.array("f", (rng.gauss(0, 0.02) for _ in range(math.prod(shape))))
                   for name, shape in shapes.items()}
        model = os.path.join(self.dir, "gpt2_tiny.bin")
        with open(model, "wb") as f:
            f.write(struct.pack("<256i", *([20240326, 3, T, V, L, 2, C, V] + [0] * 248)))
            for name in shapes:
                f.write(tensors[name].tobytes())

        # One step at learning rate 0 leaves the imported masters as they are.
        config = ["--config", self.write("tiny.pbtxt", lu.TINY_GPT)]
        for s in (f"run.dir={self.run_dir('imported')}", "run.steps=1",
                  f"model.init_from={model}", "optimizer.adamw.lr=0", "optimizer.warmup_steps=0"):
            config += ["--set", s]
        result = self.mantissa("train", *config)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"initial weights from the llm.c model {model}", result.stderr)

        out = os.path.join(self.dir, "weights.safetensors")
        result = self.mantissa("export", *config, "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(out, "rb") as f:
            data = f.read()
        # The run directory alone (as `mantissa sample --run` takes it) gives the same file.
        again = os.path.join(self.dir, "again.safetensors")
        result = self.mantissa("export", "--run", self.run_dir("imported"), "--out", again)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(again, "rb") as f:
            self.assertEqual(f.read(), data)
        header_len = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + header_len])
        payload = data[8 + header_len:]
        self.assertEqual(header["__metadata__"]["mantissa_step"], "1")

        def exported(name):
            entry = header[name]
            self.assertEqual(entry["dtype"], "F32")
            begin, end = entry["data_offsets"]
            return entry["shape"], payload[begin:end]

        C3 = 3 * C * C
        expected = {"wte": ([V, C], tensors["wte"].tobytes()),
                    "wpe": ([T, C], tensors["wpe"].tobytes()),
                    "h.1.attn.c_attn.weight": ([3 * C, C], tensors["qkvw"][C3:].tobytes()),
                    "ln_f.bias": ([C], tensors["lnfb"].tobytes())}
        for name, (shape, raw) in expected.items():
            with self.subTest(name):
                self.assertEqual(exported(name), (shape, raw))

    def test_an_interrupted_export_leaves_nothing_behind(self):
        # Ctrl-C or SIGTERM while an export writes: what it wrote goes (the temporary file, a
        # Hugging Face directory's DIR.tmp and the parents it made) and the process ends by the
        # signal. A shim holds the export at its first write to a temporary file until the
        # signal comes, so that the signal finds it half way however fast the disk is.
        config = ["--config", self.write("tiny.pbtxt", lu.TINY_GPT), "--set",
                  f"run.dir={self.run_dir('exported')}", "--set", "run.steps=1"]
        result = self.mantissa("train", *config)
        self.assertEqual(result.returncode, 0, result.stderr)
        shim = os.path.join(os.path.dirname(lu.binary()), "hold_temporary_write.so")
        for signum, out, extra in ((signal.SIGINT, "weights.safetensors", ()),
                                   (signal.SIGTERM, os.path.join("new", "hf"), ("--format", "hf"))):
            with self.subTest(signal.Signals(signum).name):
                marker = os.path.join(self.dir, "held")
                process = subprocess.Popen(
                    [lu.binary(), "export", *config, *extra, "--out", out], cwd=self.dir,
                    env=lu.environment(LD_PRELOAD=shim, HOLD_WRITE_MARKER=marker), text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
                deadline = time.time() + 60
                while not os.path.exists(marker):
                    self.assertIsNone(process.poll(), "the export ended before its first write")
                    self.assertLess(time.time(), deadline, "no write to a temporary file in 60 s")
                    time.sleep(0.01)
                os.remove(marker)
                process.send_signal(signum)
                _, stderr = process.communicate(timeout=60)
                self.assertEqual(process.returncode, -signum, stderr)
                self.assertIn(f"mantissa: interrupted by {signal.Signals(signum).name}: nothing "
                              "written, the output left as it was", stderr)
                self.assertEqual(sorted(os.listdir(self.dir)), ["exported", "tiny.pbtxt"])

    def test_hugging_face_weights_out_and_back_in(self):
        # Each family: a short run exported as a Hugging Face directory, and runs started from
        # that directory and from a sharded copy of it at learning rate 0, hold the same
        # weights: their safetensors exports carry the same bytes.
        families = {
            "gpt2": "model.gpt2={n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}",
            "llama": "model.llama={n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, "
                     "ffn_hidden: 96, seq_len: 64}",
        }
        tiny = self.write("tiny.pbtxt", lu.TINY_GPT)

        def tensors(path):
            with open(path, "rb") as f:
                data = f.read()
            n = struct.unpack("<Q", data[:8])[0]
            header = json.loads(data[8:8 + n])
            header.pop("__metadata__")
            return {name: (e["shape"], data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
                    for name, e in header.items()}

        def write_shards(hf, out):
            # hf's model.safetensors cut in two shard files, with the index transformers writes.
            os.makedirs(out)
            shutil.copy(os.path.join(hf, "config.json"), out)
            with open(os.path.join(hf, "model.safetensors"), "rb") as f:
                data = f.read()
            n = struct.unpack("<Q", data[:8])[0]
            header = json.loads(data[8:8 + n])
            metadata = header.pop("__metadata__")
            names = sorted(header)
            weight_map = {}
            for i, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
                file = f"model-0000{i + 1}-of-00002.safetensors"
                entries, blobs, offset = {"__metadata__": metadata}, [], 0
                for name in part:
                    begin, end = header[name]["data_offsets"]
                    blobs.append(data[8 + n + begin:8 + n + end])
                    entries[name] = dict(header[name], data_offsets=[offset, offset + end - begin])
                    offset += end - begin
                    weight_map[name] = file
                text = json.dumps(entries).encode()
                text += b" " * (-len(text) % 8)
                with open(os.path.join(out, file), "wb") as f:
                    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
            with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": len(data) - 8 - n},
                           "weight_map": weight_map}, f)

        for family, model in families.items():
            with self.subTest(family):
                def run(name, *sets):
                    config = ["--config", tiny, "--set", model, "--set",
                              f"run.dir={self.run_dir(family + name)}"]
                    for s in sets:
                        config += ["--set", s]
                    result = self.mantissa("train", *config)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    return config, result

                first, _ = run("first", "run.steps=2", "optimizer.warmup_steps=0")
                hf = os.path.join(self.dir, family + "_hf")
                result = self.mantissa("export", *first, "--format", "hf", "--out", hf)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(sorted(os.listdir(hf)), ["config.json", "model.safetensors"])
                with open(os.path.join(hf, "config.json")) as f:
                    self.assertEqual(json.load(f)["model_type"], family)
                result = self.mantissa("export", *first, "--format", "hf", "--out", hf)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"mantissa: --out {hf}: exists and is not empty", result.stderr)
                # A directory is created with its parents, named with a trailing slash or not.
                nested = os.path.join(self.dir, "new", family, "hf") + "/"
                result = self.mantissa("export", *first, "--format", "hf", "--out", nested)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertTrue(os.path.isfile(os.path.join(nested, "config.json")))
                # A write that fails part way (the file size limit's EFBIG here, as a full
                # disk's ENOSPC) says why and leaves nothing behind, not even the parents it
                # made for a nested --out.
                limited = os.path.join(self.dir, family + "_limited", "nested", "hf")

                def limit_file_size():
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
                result = subprocess.run([lu.binary(), "export", *first, "--format", "hf",
                                         "--out", limited], cwd=self.dir, env=lu.environment(),
                                        capture_output=True, text=True, timeout=120,
                                        preexec_fn=limit_file_size)
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertRegex(result.stderr, re.escape(f"cannot write '{limited}.tmp/"
                                                          "model.safetensors.") +
                                 r"\d+-\d+\.tmp': File too large")
                self.assertFalse(os.path.exists(os.path.join(self.dir, family + "_limited")))
                # A directory that holds nothing of ours (procfs) is refused before the
                # checkpoint is read, exit 2 as for a safetensors file there.
                result = self.mantissa("export", *first, "--format", "hf", "--out",
                                       "/proc/new/hf")
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("mantissa: --out '/proc/new/hf': cannot create a file in '/proc'",
                              result.stderr)
                # A setting that changes no shape but what the weights compute is refused, not
                # written into config.json.
                changed = {"gpt2": ("model.gpt2.n_head=4", "model.gpt2.n_head 2 -> 4"),
                           "llama": ("model.llama.rope_theta=500000",
                                     "model.llama.rope_theta 10000 -> 500000")}[family]
                other = os.path.join(self.dir, family + "_changed_hf")
                result = self.mantissa("export", *first, "--set", changed[0], "--format", "hf",
                                       "--out", other)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("was trained with another model config (checkpoint -> this config: "
                              + changed[1] + ")", result.stderr)
                self.assertFalse(os.path.exists(other))
                # It is refused from the manifest, before the weights are read: with the
                # payload gone, the same message.
                gone = self.run_dir(family + "payload_gone")
                shutil.copytree(self.run_dir(family + "first"), gone)
                for step_dir in glob.glob(os.path.join(gone, "checkpoints", "step_*")):
                    os.remove(os.path.join(step_dir, "rank_00000.bin"))
                result = self.mantissa("export", *first, "--set", f"run.dir={gone}", "--set",
                                       changed[0], "--format", "hf", "--out", other)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("was trained with another model config", result.stderr)

                second, result = run("second", "run.steps=1", f"model.init_from={hf}",
                                     "optimizer.adamw.lr=0", "optimizer.warmup_steps=0")
                self.assertIn(f"initial weights from the Hugging Face model {hf}", result.stderr)
                # The same weights in two shards that model.safetensors.index.json lists, as
                # transformers saves large models (no model.safetensors).
                sharded = os.path.join(self.dir, family + "_sharded")
                write_shards(hf, sharded)
                third, result = run("third", "run.steps=1", f"model.init_from={sharded}",
                                    "optimizer.adamw.lr=0", "optimizer.warmup_steps=0")
                self.assertIn(f"initial weights from the Hugging Face model {sharded}",
                              result.stderr)
                exports = []
                for config in (first, second, third):
                    out = os.path.join(self.dir, f"{family}_{len(exports)}.safetensors")
                    result = self.mantissa("export", *config, "--out", out)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    exports.append(tensors(out))
                for other in exports[1:]:
                    self.assertEqual(exports[0].keys(), other.keys())
                    for name in exports[0]:
                        self.assertEqual(exports[0][name], other[name], name)
                # Only a start that resumes nothing reads model.init_from: with those weights
                # gone, the run resumes, exports and plans; a fresh start is refused naming it.
                shutil.rmtree(sharded)
                result = self.mantissa("train", *third, "--set", "run.steps=2")
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("resumed at step 1", result.stderr)
                gone = os.path.join(self.dir, f"{family}_gone.safetensors")
                for command in (("export", *third, "--out", gone), ("plan", *third, "--gpus", "1"),
                                ("config", *third)):
                    result = self.mantissa(*command)
                    self.assertEqual(result.returncode, 0, result.stderr)
                result = self.mantissa("train", *third, "--set",
                                       f"run.dir={self.run_dir(family + 'fresh')}")
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f'model.init_from = "{sharded}": cannot be read: No such file or '
                              "directory", result.stderr)

        # The MLP has no Hugging Face layout.
        mlp = ["--config", tiny, "--set", "model.mlp={}", "--set",
               f"run.dir={self.run_dir('mlp')}", "--set", "run.steps=1", "--set",
               "optimizer.warmup_steps=0"]
        self.assertEqual(self.mantissa("train", *mlp).returncode, 0)
        result = self.mantissa("export", *mlp, "--format", "hf", "--out",
                               os.path.join(self.dir, "mlp_hf"))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--format hf: Hugging Face model directories hold GPT-2 and Llama models",
                      result.stderr)

    def test_divergence_guard_scale_stuck_at_minimum(self):
        # BF16 runs without loss scaling, so its fixed scale 1 is the minimum: three
        # overflowing steps in a row (planted on rank 1) end the run on both ranks.
        result = self.mantissa(*self.train_args(
            "stuck", "precision.loss_scale.max_overflows_at_min=3",
            "debug.inject_nonfinite_steps=8", "debug.inject_nonfinite_steps=9"), ranks=RANKS)
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertIn("mantissa: training diverged at step 10/60: loss scale stuck at minimum 1 "
                      "after 3 consecutive overflowing steps", result.stderr)
        # The step that ended the run is logged too (0-based 9), on both ranks.
        for rank in range(RANKS):
            log = lu.read_log(self.run_dir("stuck"), rank)
            self.assertEqual([e["step"] for e in log if e["overflow"]], [7, 8, 9])
            self.assertEqual(log[-1]["step"], 9)
            self.assertEqual(log[-1]["skipped_param"], "wte")

    def test_checkpoint_of_another_model_is_a_config_error(self):
        # Both ranks find that the run directory's checkpoint was saved by a 2-layer model,
        # refuse it (no fallback to training from scratch over it) and exit 2: a retry with
        # the same config would fail the same way.
        result = self.mantissa(*self.train_args("other", "run.steps=20"), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.mantissa(*self.train_args("other", "model.gpt2.n_layer=3"), ranks=RANKS)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("step_00000020 does not fit this model", result.stderr)
        self.assertIn("; its model config differs: model.gpt2.n_layer 2 -> 3 (resume with the "
                      "model config it was trained with", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir("other"), "checkpoints",
                                                     "step_00000040")))

    def test_fp16_without_loss_scaling_is_warned_of(self):
        # Allowed, but not FP16's default: a run.dir/config.pbtxt of a BF16 run lists
        # loss_scale.mode NONE, and resumed with --set precision.mode=FP16 it keeps it.
        result = self.mantissa(*self.train_args("fp16", "run.steps=8", "precision.mode=FP16",
                                                "precision.loss_scale.mode=NONE", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: warning: precision.mode FP16 with precision.loss_scale.mode "
                      "NONE: gradients smaller than about 6e-8", result.stderr)
        result = self.mantissa(*self.train_args("fp16_default", "run.steps=8",
                                                "precision.mode=FP16", inject_rank=0))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("loss_scale.mode NONE", result.stderr)

    def test_checkpoint_of_other_heads_is_a_config_error(self):
        # Other heads fit every weight's shape and split the attention differently: the
        # checkpoint's weights would compute something else. It was resumed without a word.
        result = self.mantissa(*self.train_args("heads", "run.steps=20"), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.mantissa(*self.train_args("heads", "model.gpt2.n_head=4"), ranks=RANKS)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("checkpoint step 20 in " + os.path.join(self.run_dir("heads"), "checkpoints")
                      + " was trained with another model config (checkpoint -> this config: "
                      "model.gpt2.n_head 2 -> 4)", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir("heads"), "checkpoints",
                                                     "step_00000040")))

    def test_resume_never_over_checkpoints_stops_every_rank(self):
        # The ranks list the checkpoints together (a collective) and all stop with exit 2;
        # ranks that list different ones: test_checkpoint's RanksThatListDifferentCheckpoints.
        result = self.mantissa(*self.train_args("never", "run.steps=20"), ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.mantissa(*self.train_args("never", "checkpoint.resume=NEVER"), ranks=RANKS)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("checkpoint.resume = NEVER: " + os.path.join(self.run_dir("never"),
                      "checkpoints") + " holds checkpoints (the newest of step 20)", result.stderr)

    def write_llama3_shard(self, name, tokens):
        """An llm.c Llama-3 shard: magic 20240801, version 7, then the tokens as uint32."""
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<256i", *([20240801, 7, len(tokens)] + [0] * 253)))
            f.write(array.array("I", tokens).tobytes())
        return path

    def test_llama3_shards_feed_a_vocabulary_past_uint16(self):
        # Ids past 65,535 in llm.c's uint32 shards train a model with a vocabulary of 70,000
        # on two ranks.
        config = self.write("wide.pbtxt", """
run { steps: 4 device: CPU log_every: 1 }
model { mlp { n_embd: 32 hidden: 64 seq_len: 16 vocab_size: 70000 } }
data { micro_batch_size: 2 }
""")
        rng = random.Random(5)
        tokens = [65536 + 97 * rng.randrange(45) for _ in range(3000)] + [69999, 0, 1]
        shard = self.write_llama3_shard("wide_000000.bin", tokens)
        args = ["train", "--config", config, "--set", f"data.token_shards.pattern={shard}"]
        result = self.mantissa(*args, "--set", f"run.dir={self.run_dir('wide')}", ranks=RANKS)
        self.assertEqual(result.returncode, 0, result.stderr)
        log = lu.read_log(self.run_dir("wide"), 0)
        self.assertEqual([e["step"] for e in log], [0, 1, 2, 3])
        self.assertTrue(all(math.isfinite(e["loss"]) for e in log))

        # A token past the vocabulary is found by the batch that reads it (here the first: the
        # shard holds one window), on whichever rank, and stops the job with exit 2 naming it.
        bad = self.write_llama3_shard("bad_000000.bin", [65536 + t for t in range(16)] + [70000])
        args[-1] = f"data.token_shards.pattern={bad}"
        result = self.mantissa(*args, "--set", f"run.dir={self.run_dir('bad')}", ranks=RANKS)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f"'{bad}': token 70000 at position 16 is >= vocab_size 70000",
                      result.stderr)

    def test_divergence_guard_nonfinite_loss(self):
        result = self.mantissa(*self.train_args("nan", "optimizer.adamw.lr=1e30",
                                                "optimizer.warmup_steps=0", inject_rank=0))
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertRegex(result.stderr, r"mantissa: training diverged at step \d+/60: the loss "
                                        r"is not finite")
        log = lu.read_log(self.run_dir("nan"), 0)
        self.assertIsNone(log[-1]["mean_loss"])  # JSON has no NaN: written as null

    def test_ranks_must_share_settings_and_tokens(self):
        # mpirun's colon-separated programs, each in a working directory of its own, stand for
        # hosts that each read their own copy of the config's relative data path.
        config = self.write("text.pbtxt", lu.TINY_GPT.replace(
            "synthetic { n_tokens: 262144 }", 'text_file { path: "corpus.txt" }'))
        rng = random.Random(11)
        text = "".join(rng.choice("abcdefgh \n") for _ in range(40000))
        for host, name, corpus in (("a", "corpus.txt", text), ("b", "copy.txt", text),
                                   ("c", "corpus.txt", text[::-1])):
            os.makedirs(os.path.join(self.dir, host))
            self.write(os.path.join(host, name), corpus)

        def train(name, *ranks):
            """One program per (working directory, --set options) in `ranks`."""
            command = ["mpirun", "--oversubscribe", "-x", "OMP_NUM_THREADS"]
            for i, (host, sets) in enumerate(ranks):
                command += ([":"] if i else []) + [
                    "-np", "1", "-wdir", os.path.join(self.dir, host), lu.binary(), "train",
                    "--config", config, "--set", f"run.dir={self.run_dir(name)}",
                    "--set", "run.steps=4"]
                for s in sets:
                    command += ["--set", s]
            return subprocess.run(command, cwd=self.dir, env=lu.environment(), timeout=120,
                                  capture_output=True, text=True)

        # The same tokens under another name, other metrics: the run trains.
        same = train("same", ("a", ["metrics.job=a"]),
                     ("b", ["metrics.job=b", "data.text_file.path=copy.txt"]))
        self.assertEqual(same.returncode, 0, same.stderr[-3000:])
        self.assertEqual([e["step"] for e in lu.read_log(self.run_dir("same"), 1)], [0, 1, 2, 3])
        self.assertEqual([n for n in os.listdir(self.run_dir("same")) if n.startswith(".shared")],
                         [], "the start's check leaves nothing in run.dir")

        tokens = train("tokens", ("a", []), ("c", []))
        self.assertEqual(tokens.returncode, 2, tokens.stderr[-3000:])
        self.assertRegex(tokens.stderr,
                         r"the ranks read different training tokens: rank 0 \(host [^)]+\): "
                         r"\d+ tokens \(fingerprint [0-9a-f]{16}\) from corpus.txt; rank 1 "
                         r"\(host [^)]+\): \d+ tokens \(fingerprint [0-9a-f]{16}\) from "
                         r"corpus.txt. Every rank must read the same corpus")
        self.assertEqual(tokens.stderr.count("different training tokens"), 1, tokens.stderr)
        self.assertNotIn("MPI_ABORT", tokens.stderr, "every rank ends alike, none aborts")
        self.assertFalse(os.path.exists(self.run_dir("tokens")), "a failed start leaves nothing")

        settings = train("settings", ("a", []), ("a", ["optimizer.adamw.lr=0.01"]))
        self.assertEqual(settings.returncode, 2, settings.stderr[-3000:])
        self.assertIn("(rank 0's -> rank 1's: optimizer.adamw.lr 0.003 -> 0.01). Every rank "
                      "must run the same config", settings.stderr)
        self.assertNotIn("MPI_ABORT", settings.stderr)

        # A relative run.dir, which each rank takes from its own working directory: two
        # directories, which checkpoints could not join.
        apart = train("apart", ("a", ["run.dir=run"]),
                      ("b", ["run.dir=run", "data.text_file.path=copy.txt"]))
        self.assertEqual(apart.returncode, 2, apart.stderr[-3000:])
        self.assertIn('run.dir = "run" is not one directory shared by every rank: rank 1 (host ',
                      apart.stderr)
        self.assertIn(f"(rank 1: rank 0's file '{os.path.join(self.dir, 'b', 'run', '.shared-')}",
                      apart.stderr)
        self.assertIn("(a relative run.dir is taken from each rank's working directory)",
                      apart.stderr)
        self.assertNotIn("MPI_ABORT", apart.stderr)
        for host in ("a", "b"):
            self.assertFalse(os.path.exists(os.path.join(self.dir, host, "run")), host)

        # A config refused on another rank than rank 0 (its host lacks the file) ends every
        # rank, and rank 0 says why.
        refused = train("refused", ("a", []), ("b", []))
        self.assertEqual(refused.returncode, 2, refused.stderr[-3000:])
        self.assertIn('mantissa: rank 1: data.text_file.path = "corpus.txt": cannot be read',
                      refused.stderr)
        self.assertNotIn("MPI_ABORT", refused.stderr)

    def test_a_metrics_port_one_rank_cannot_take_ends_every_rank_alike(self):
        # Rank 1 serves metrics on metrics.port + 1, past the last port: its refusal joins the
        # ranks' verdicts, so the job ends without MPI_Abort's banner and rank 0 removes the
        # run.dir it made (it used to abort there, leaving run.dir with its lock).
        config = self.write("tiny.pbtxt", lu.TINY_GPT)
        result = self.mantissa("train", "--config", config, "--set",
                               f"run.dir={self.run_dir('port')}", "--set", "metrics.port=65535",
                               ranks=RANKS)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("mantissa: rank 1: metrics.port = 65535: plus the local rank 1 must be "
                      "<= 65535", result.stderr)
        self.assertNotIn("MPI_ABORT", result.stderr)
        self.assertFalse(os.path.exists(self.run_dir("port")))


if __name__ == "__main__":
    lu.main()
