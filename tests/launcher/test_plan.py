#!/usr/bin/env python3
"""`mantissa plan` as a user runs it: every shipped GPT-2 and Llama config projects (their data
files need not exist here), the projection line agrees with the table, more GPUs give more
tokens/s and less memory under ZeRO-1, and every bad command line or cluster gets one line
naming the option or field, with exit code 2."""

import os
import re
import subprocess
import sys

import launcher_util as lu


def projection(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("projection: ")]
    if len(line) != 1:
        raise AssertionError(f"no single projection line in:\n{stdout}")
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.e+-]+)", line[0])}


class Plan(lu.TempDirTest):
    def plan(self, *args):
        result = self.mantissa("plan", *args)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def config(self, name):
        return os.path.join(lu.ARGS.source_dir, "configs", name)

    def test_every_shipped_transformer_config_projects(self):
        for name in sorted(os.listdir(os.path.join(lu.ARGS.source_dir, "configs"))):
            with self.subTest(name):
                out = self.plan("--config", self.config(name), "--gpus", "16", "--gpu", "h200")
                p = projection(out)
                self.assertGreater(p["tokens_per_s"], 0)
                self.assertTrue(0 < p["mfu"] < 1, out)
                self.assertAlmostEqual(p["step_s"], p["compute_s"] + p["memory_s"] +
                                       p["exposed_s"], delta=1e-5 * p["step_s"])
                # The table marks the config's own row, whose total is the projection's.
                marked = [l for l in out.splitlines() if l.startswith(" * ")]
                self.assertEqual(len(marked), 1, out)
                self.assertAlmostEqual(float(marked[0].split()[-1]), p["memory_gib"], delta=0.01)

    def test_more_gpus(self):
        base = ["--config", self.config("gpt2-1.5b.pbtxt"), "--gpu", "h100"]
        small, large = (projection(self.plan(*base, "--gpus", str(n))) for n in (8, 64))
        self.assertGreater(large["tokens_per_s"], 4 * small["tokens_per_s"])
        self.assertLess(large["memory_gib"], small["memory_gib"])  # the config uses ZeRO-1
        self.assertEqual(small["device_gib"], 80)
        # 12 GPUs, 8 to a node: the second node is a partial one, and the cluster line says so.
        self.assertIn("8 per node on 2 nodes (the last with 4)", self.plan(*base, "--gpus", "12"))
        self.assertNotIn("the last with", self.plan(*base, "--gpus", "16"))
        # Above 1 at a peak of one's own (one --tflops for every precision), not at the GPU's.
        self.assertIn("efficiency 1.20", self.plan(*base, "--gpus", "8", "--tflops", "500",
                                                   "--efficiency", "1.2"))
        single_out = self.plan(*base, "--gpus", "1")
        single = projection(single_out)
        self.assertEqual(single["exposed_s"], 0)
        self.assertIn("all-reduce     0.0000 s  (one rank: nothing to reduce)\n", single_out)
        self.assertIn(" GiB of gradients per rank in ", self.plan(*base, "--gpus", "8"))
        # One rank has an MFU too (it printed 0).
        self.assertAlmostEqual(single["mfu"] / small["mfu"], 1.0, delta=0.3)

    def test_cpu_ranks_of_the_test_cluster(self):
        out = self.plan("--config", self.config("demo.pbtxt"), "--gpus", "4", "--gpu", "cpu",
                        "--tflops", "0.1", "--cores", "2", "--link-gbps", "1",
                        "--efficiency", "0.4")
        self.assertIn("sharing 2 cores", out)
        self.assertIn("efficiency 0.40", out)
        self.assertGreater(projection(out)["comm_s"], 0)
        self.assertIn(" tokens x 1 micro-batch per rank x 4 ranks = ", out)
        accumulated = self.plan("--config", self.config("demo.pbtxt"), "--gpus", "4", "--gpu",
                                "cpu", "--tflops", "0.1", "--cores", "2", "--link-gbps", "1",
                                "--set", "data.grad_accum_steps=3")
        self.assertIn(" tokens x 3 micro-batches per rank x 4 ranks = ", accumulated)

    def test_memory_is_what_a_cpu_run_takes_at_its_peak(self):
        # The peak resident memory of a real run (one rank, one thread) against the plan's
        # total, in a mode whose loss reads FP32 logits beside the logit gradients (BF16) and
        # in one that writes them in place (FP32). The vocabulary is large, so the logits
        # decide the peak: without them the BF16 plan came to 0.6 of the measured peak. The
        # plan counts the copy of the logit gradients that AVX512-BF16 and AMX GEMMs keep on
        # every CPU, so on AVX2-only CPUs it is above the peak (0.76 of it measured there).
        config = self.write("vocab.pbtxt", """
run { steps: 2 device: CPU eval_every: 0 }
model { gpt2 { n_layer: 1 n_head: 2 n_embd: 64 seq_len: 256 vocab_size: 50257 } }
data { synthetic { n_tokens: 100000 } micro_batch_size: 8 }
""")
        for mode in ("BF16", "FP32"):
            with self.subTest(mode):
                planned = projection(self.plan("--config", config, "--gpus", "1", "--gpu", "cpu",
                                               "--tflops", "0.1", "--set",
                                               f"precision.mode={mode}"))["memory_gib"]
                process = subprocess.Popen(
                    [lu.binary(), "train", "--config", config, "--set", f"precision.mode={mode}",
                     "--set", f"run.dir={self.dir}/{mode}"],
                    cwd=self.dir, env=lu.environment(), stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, text=True)
                try:
                    stderr = process.stderr.read()
                    _, status, usage = os.wait4(process.pid, 0)
                finally:
                    if process.poll() is None:
                        process.kill()
                self.assertEqual(os.waitstatus_to_exitcode(status), 0, stderr)
                measured = usage.ru_maxrss / 1024 / 1024  # KiB -> GiB
                self.assertTrue(0.7 < measured / planned < 1.2,
                                f"planned {planned:.3f} GiB, measured peak {measured:.3f} GiB")

    def test_cpu_ranks_sharing_a_node(self):
        # Their all-reduce goes through shared memory, at the rate --node-gbps gives (it was
        # projected as never ending: no default rate for CPUs).
        args = ["--config", self.config("demo.pbtxt"), "--gpus", "2", "--gpu", "cpu", "--tflops",
                "0.1", "--gpus-per-node", "2"]
        slow, fast = (projection(self.plan(*args, "--node-gbps", g)) for g in ("1", "4"))
        self.assertTrue(0 < fast["comm_s"] < slow["comm_s"], (slow, fast))
        # 4x the rate: the bytes' time a quarter, the latency the same.
        self.assertTrue(2 < slow["comm_s"] / fast["comm_s"] <= 4, (slow, fast))

    def test_docs_table_is_current(self):
        """docs/plan.md's projections are what scripts/plan-table.py prints today."""
        with open(os.path.join(lu.ARGS.source_dir, "docs", "plan.md")) as f:
            documented = [l.rstrip("\n") for l in f if l.startswith("| GPT-2 ")]
        result = subprocess.run([sys.executable,
                                 os.path.join(lu.ARGS.source_dir, "scripts", "plan-table.py"),
                                 lu.ARGS.build_dir], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        printed = [l for l in result.stdout.splitlines() if l.startswith("| GPT-2 ")]
        self.assertEqual(len(printed), 16)
        self.assertEqual(documented, printed)

    def test_help(self):
        out = self.plan("--help")
        for option in ("--gpus", "--gpu", "--gpus-per-node", "--link-gbps", "--node-gbps",
                       "--tflops",
                       "--efficiency", "--memory-gbps", "--cores", "--set"):
            self.assertIn(option, out)

    def test_notes_go_to_stderr(self):
        # As every command's: the report on stdout is for scripts too.
        result = self.mantissa("plan", "--config", self.config("gpt2.pbtxt"), "--gpus", "8",
                               "--set", "model.llama.n_layer=2")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: note: --set model.llama.n_layer=2 selects model.llama",
                      result.stderr)
        self.assertTrue(result.stdout.startswith("mantissa plan: "), result.stdout)

    def test_errors_name_the_option_or_field(self):
        gpt2 = self.config("gpt2.pbtxt")
        cases = [
            (["--gpus", "8"], "--config FILE.pbtxt is required"),
            (["--config", gpt2], "--gpus N is required"),
            (["--config", gpt2, "--gpus", "0"], "--gpus 0: must be a whole number >= 1"),
            (["--config", gpt2, "--gpus", "1000001"], "--gpus 1000001: must be at most 1000000"),
            (["--config", gpt2, "--gpus", "8", "--gpu", "v100"],
             "--gpu v100: unknown device (known: a100, h100, h200, cpu)"),
            (["--config", gpt2, "--gpus", "2", "--gpu", "cpu"], "--gpu cpu needs --tflops"),
            (["--config", gpt2, "--gpus", "2", "--gpu", "cpu", "--tflops", "1"],
             "--link-gbps: needed for cpu ranks on several nodes"),
            (["--config", gpt2, "--gpus", "2", "--gpu", "cpu", "--tflops", "1",
              "--gpus-per-node", "2"], "--node-gbps: needed for cpu ranks sharing a node"),
            (["--config", gpt2, "--gpus", "8", "--node-gbps", "0"],
             "--node-gbps 0: must be a number in [0.001, 1e+06]"),
            (["--config", gpt2, "--gpus", "8", "--tflops", "1e-300"],
             "--tflops 1e-300: must be a number in [0.001, 1e+06]"),
            (["--config", gpt2, "--gpus", "8", "--cores", "2"], "--cores: for --gpu cpu only"),
            (["--config", gpt2, "--gpus", "8", "--efficiency", "4.5"], "--efficiency 4.5: must be a number in [0.01, 4]"),
            (["--config", gpt2, "--gpus", "8", "--efficiency", "1e-300"],
             "--efficiency 1e-300: must be a number in [0.01, 4]"),
            (["--config", gpt2, "--gpus", "8", "--efficiency", "1.5"],
             "--efficiency 1.5: at most 1 on a GPU at its own peaks"),
            (["--config", gpt2, "--gpus", "8", "--gpu", "a100", "--set",
              "precision.mode=FP8_HYBRID"], "has no FP8 tensor cores"),
            (["--config", gpt2, "--gpus", "8", "--gpu", "h100", "--set",
              "precision.mode=FP8_HYBRID", "--set", "precision.fp8.recipe=MXFP8"],
             "precision.fp8.recipe = MXFP8: MXFP8 (1x32 E8M0) scales run on compute capability "
             "10.0 and newer (Blackwell); NVIDIA H100 SXM 80GB does not have them"),
            (["--config", gpt2, "--gpus", "8", "--set", "model.gpt2.n_head=5"],
             "model.gpt2.n_head"),
            (["--config", gpt2, "--gpus", "8", "--set", "model.mlp={}"], "model.mlp"),
            (["--config", gpt2, "--gpus", "8", "--nodes", "2"], "unknown argument '--nodes'"),
            (["--config", gpt2, "--config", gpt2, "--gpus", "8"], "--config given twice"),
            (["--config", gpt2, "--gpus", "1", "--gpus", "4"], "--gpus given twice"),
            # A refusal that cites a member a --set switched to says so, as train's does.
            (["--config", self.write("eval64.pbtxt", "run { eval_tokens: 64 }\n"
                                                   "model { gpt2 { seq_len: 64 } }\n"),
              "--gpus", "8", "--set", "model.llama.n_layer=1"],
             "run.eval_tokens = 64: must be >= model.llama.seq_len = 256 (one window) (note: "
             "--set model.llama.n_layer=1 selects model.llama in place of model.gpt2"),
        ]
        for args, message in cases:
            with self.subTest(args):
                result = self.mantissa("plan", *args)
                self.assertEqual(result.returncode, 2, result.stderr)
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertIn(message, lines[0])


if __name__ == "__main__":
    lu.main()
