"""Held-out evaluation in whole runs of the real binary:
 - a text file's tail (data.text_file.val_fraction) is the validation set; run.eval_every
   steps and the last step log val_loss (on every rank alike), the progress line shows it,
   and it falls as the model learns; its all-reduces are not counted as the step's;
 - in FP32 the validation loss on one rank equals that on two within 1e-6 relative (each rank
   evaluates its own slice of the same windows; one all-reduce adds them);
 - a run stopped and resumed continues the curve: the evaluations after the resume equal those
   of an uninterrupted run, and no evaluation step is missing or logged twice;
 - the synthetic corpus and token shards (data.token_shards.val_pattern) have validation sets
   too, and a run without one, or with eval_every 0, logs no val_loss;
 - a stop signal on one rank during an evaluation cuts it short on every rank: the run stops
   after that step with a checkpoint and logs no validation loss for it (every rank alike); a
   rank that hangs in one is named by the timeout, which says the job was evaluating;
 - bad settings are refused naming the field (exit code 2).
"""

import math
import os
import re
import signal
import time

import launcher_util as lu

# /usr/share/common-licenses is on every Debian machine: about 270 kB of English text.
LICENSES = "/usr/share/common-licenses"

# A constant learning rate after warm-up, so that a run cut in two follows the same schedule.
CONFIG = """
run { steps: 40 seed: 5 device: CPU log_every: 10 eval_every: 10 eval_tokens: 4096 }
model { gpt2 { n_layer: 2 n_head: 2 n_embd: 64 seq_len: 64 } }
data { text_file { path: "licenses.txt" } micro_batch_size: 4 }
optimizer { adamw { lr: 0.002 weight_decay: 0 } warmup_steps: 4 min_lr_ratio: 1 }
precision { mode: FP32 }
checkpoint { every_steps: 20 }
"""


class Evaluation(lu.TempDirTest):
    def setUp(self):
        super().setUp()
        with open(os.path.join(self.dir, "licenses.txt"), "wb") as out:
            for name in sorted(os.listdir(LICENSES)):
                path = os.path.join(LICENSES, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as f:
                        out.write(f.read())

    def train(self, name, *sets, ranks=0):
        config = self.write("eval.pbtxt", CONFIG)
        args = ["train", "--config", config, "--progress", "lines",
                "--set", f"run.dir={os.path.join(self.dir, name)}"]
        for s in sets:
            args += ["--set", s]
        result = self.mantissa(*args, ranks=ranks, timeout=240)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def val_losses(self, name, rank=0):
        return {e["step"]: e["val_loss"] for e in lu.read_log(os.path.join(self.dir, name), rank)
                if "val_loss" in e}

    def test_val_loss_is_logged_shown_and_falls(self):
        result = self.train("two", ranks=2)
        curves = [self.val_losses("two", r) for r in range(2)]
        self.assertEqual(sorted(curves[0]), [9, 19, 29, 39])
        self.assertEqual(curves[0], curves[1], "every rank logs the same all-reduced loss")
        self.assertIn("| val loss ", result.stderr)
        log = lu.read_log(os.path.join(self.dir, "two"), 0)
        for entry in log:
            self.assertEqual("eval_seconds" in entry, "val_loss" in entry, entry)
            if "val_loss" in entry:
                self.assertGreater(entry["eval_seconds"], 0)
        # An evaluation's all-reduces are not the step's: every step hands its collectives the
        # same bytes (FP32 gradients and the step's scalars), evaluating or not.
        self.assertEqual({e["allreduce_bytes"] for e in log}, {log[0]["allreduce_bytes"]})
        self.assertGreater(log[0]["allreduce_bytes"], 0)
        first, last = curves[0][9], curves[0][39]
        self.assertLess(last, first - 0.1, f"the validation loss should fall: {curves[0]}")
        self.assertTrue(all(math.isfinite(v) for v in curves[0].values()))

    def test_a_validation_set_smaller_than_eval_tokens_is_noted(self):
        result = self.train("capped", "run.steps=10", "run.eval_tokens=100000000")
        notes = re.findall(r"^mantissa: note: run.eval_tokens is 100000000, and the validation "
                           r"set holds (\d+) tokens in whole windows of seq_len \+ 1: each "
                           r"evaluation reads (\d+) of them$", result.stderr, re.M)
        self.assertEqual(len(notes), 1, result.stderr)
        self.assertEqual(notes[0][0], notes[0][1])
        self.assertLess(int(notes[0][0]), 100000000)
        self.assertEqual(int(notes[0][0]) % 64, 0, "whole windows of seq_len 64")
        self.assertNotIn("note: run.eval_tokens", self.train("fits", "run.steps=10").stderr)
        # BLOCKWISE's forward passes take a multiple of 8 tokens: with seq_len 6 the 7 windows
        # asked for become one group of 4, which the note says, though the set holds more.
        grouped = self.train("grouped", "run.steps=1", "run.eval_tokens=42",
                             "model.gpt2.seq_len=6", "model.gpt2.n_embd=128",
                             "data.micro_batch_size=64", "precision.mode=FP8_HYBRID",
                             "precision.fp8.recipe=BLOCKWISE")
        self.assertIn("mantissa: note: run.eval_tokens is 42, and each evaluation reads 24 tokens "
                      "in whole groups of 4 windows (this model's forward passes take a multiple "
                      "of 8 tokens)\n", grouped.stderr)
        # At least one group: 2 windows asked for, 4 read.
        grouped = self.train("rounded_up", "run.steps=1", "run.eval_tokens=12",
                             "model.gpt2.seq_len=6", "model.gpt2.n_embd=128",
                             "data.micro_batch_size=64", "precision.mode=FP8_HYBRID",
                             "precision.fp8.recipe=BLOCKWISE")
        self.assertIn("mantissa: note: run.eval_tokens is 12, and each evaluation reads 24 tokens "
                      "in whole groups of 4 windows", grouped.stderr)

    def test_one_rank_equals_two_in_fp32(self):
        # The same weights on both (a learning rate too small to move an FP32 weight), the same
        # windows: only how they are cut over ranks and batches differs.
        frozen = ("optimizer.adamw.lr=1e-30", "optimizer.warmup_steps=0", "run.steps=2",
                  "run.eval_every=1")
        self.train("one", *frozen)
        self.train("two", *frozen, ranks=2)
        one, two = self.val_losses("one"), self.val_losses("two")
        self.assertEqual(sorted(one), [0, 1])
        self.assertEqual(sorted(one), sorted(two))
        for step in one:
            self.assertAlmostEqual(one[step] / two[step], 1.0, delta=1e-6,
                                   msg=f"step {step}: 1 rank {one[step]!r}, 2 ranks {two[step]!r}")

    def test_resume_continues_the_curve(self):
        self.train("whole", ranks=2)
        self.train("parts", "run.steps=20", ranks=2)
        resumed = self.train("parts", ranks=2)
        checkpoint = os.path.join(self.dir, "parts", "checkpoints", "step_00000020")
        self.assertIn(f"mantissa: resumed from {checkpoint} (saved by 2 ranks)",
                      resumed.stdout + resumed.stderr)
        whole, parts = self.val_losses("whole"), self.val_losses("parts")
        self.assertEqual(parts, whole)
        steps = [e["step"] for e in lu.read_log(os.path.join(self.dir, "parts"), 0)
                 if "val_loss" in e]
        self.assertEqual(steps, [9, 19, 29, 39], "no evaluation missing or repeated")

    def test_other_sources_and_off(self):
        tiny = self.write("tiny.pbtxt", lu.TINY_GPT)

        def run(name, *sets, eval_every=4):
            args = ["train", "--config", tiny, "--set", f"run.dir={os.path.join(self.dir, name)}",
                    "--set", "run.steps=8"]
            if eval_every is not None:
                args += ["--set", f"run.eval_every={eval_every}"]
            for s in sets:
                args += ["--set", s]
            result = self.mantissa(*args)
            self.assertEqual(result.returncode, 0, result.stderr)
            return self.val_losses(name)

        self.assertEqual(sorted(run("synthetic")), [3, 7])
        self.assertEqual(run("off", "run.eval_every=0"), {})
        # No validation set and run.eval_every unset: its default is then 0, not 100 (which
        # would be refused for want of a validation set).
        self.assertEqual(run("none", "data.synthetic.val_tokens=0", eval_every=None), {})

        # Token shards: the same tokens as training and validation sets, in two files (one file
        # matched by both globs is refused: test_cli.py).
        shard, val_shard = (os.path.join(self.dir, name) for name in ("tokens.bin", "val.bin"))
        count = 20000
        for path in (shard, val_shard):
            with open(path, "wb") as f:
                header = [20240520, 1, count] + [0] * 253
                f.write(b"".join(v.to_bytes(4, "little", signed=True) for v in header))
                f.write(b"".join(((i * 7) % 256).to_bytes(2, "little") for i in range(count)))
        shards = run("shards", f"data.token_shards.pattern={shard}",
                     f"data.token_shards.val_pattern={val_shard}")
        self.assertEqual(sorted(shards), [3, 7])

    def signal_rank_1_during_an_evaluation(self, name, sig, *sets):
        """Trains on 2 ranks with dist.timeout_s 4 and evaluations of about 150 steps' time
        (6-10 s on 2 idle cores), with `sets` last; sends `sig` to rank 1 a sixth of the way
        into the evaluation after step 4. Returns (exit code, stderr)."""
        config = self.write("eval.pbtxt", CONFIG)
        process = self.start(
            "train", "--config", config, "--progress", "lines",
            *[arg for s in (f"run.dir={os.path.join(self.dir, name)}", "run.steps=2000",
                            "run.eval_every=2", "run.eval_tokens=100000000",
                            "data.text_file.val_fraction=0.5", "model.gpt2.n_layer=4",
                            "model.gpt2.n_head=4", "model.gpt2.n_embd=256",
                            "checkpoint.every_steps=0", "dist.timeout_s=4", *sets)
              for arg in ("--set", s)], ranks=2)
        rank_1 = None
        try:
            lu.wait_for_lines(os.path.join(self.dir, name, "log", "rank0.jsonl"), 2, process)
            first = lu.read_log(os.path.join(self.dir, name), 0)[1]
            time.sleep(first["eval_seconds"] / 6)
            rank_1 = lu.rank_pids(process.pid)[1]
            os.kill(rank_1, sig)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
            if sig == signal.SIGSTOP and rank_1 is not None:
                try:
                    os.kill(rank_1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return process.returncode, stderr

    def test_a_stop_during_the_last_evaluation_goes_to_the_checkpoint(self):
        # The evaluation after the last step gives way too: the run's checkpoint comes after
        # it, and a preemption's grace period must not be spent evaluating (it ran to its end).
        name = "stopped_last"
        code, stderr = self.signal_rank_1_during_an_evaluation(name, signal.SIGTERM,
                                                               "run.steps=4")
        self.assertEqual(code, 0, stderr)
        self.assertIn("mantissa: the evaluation after step 4/4 gave way to the stop: that step "
                      "has no validation loss", stderr)
        self.assertTrue(os.path.isdir(os.path.join(self.dir, name, "checkpoints",
                                                   "step_00000004")))
        self.assertNotIn("val_loss", lu.read_log(os.path.join(self.dir, name), 0)[-1])

    def test_a_stop_during_an_evaluation_ends_the_run_without_it(self):
        # A preemption's grace period is short: a stop that comes during an evaluation goes to
        # its checkpoint at once. Only rank 1 gets the SIGTERM; the ranks agree after every
        # micro-batch, so rank 0 gives way too, and this step has no validation loss on either.
        # Had rank 0 evaluated to the end, rank 1 would have waited for it past dist.timeout_s
        # and the job would have failed.
        name = "stopped"
        code, stderr = self.signal_rank_1_during_an_evaluation(name, signal.SIGTERM)
        self.assertEqual(code, 0, stderr)
        self.assertIn("mantissa: the evaluation after step 4/2000 gave way to the stop: that step "
                      "has no validation loss", stderr)
        self.assertIn("stopped after step 4/2000 with a checkpoint", stderr)
        self.assertTrue(os.path.isdir(os.path.join(self.dir, name, "checkpoints",
                                                   "step_00000004")))
        for rank in range(2):
            log = lu.read_log(os.path.join(self.dir, name), rank)
            self.assertEqual([e["step"] for e in log if "val_loss" in e], [1], f"rank {rank}")

    def test_a_rank_that_hangs_during_an_evaluation_is_named_with_it(self):
        # Rank 1 stops answering (SIGSTOP) in the evaluation: rank 0's wait times out, and its
        # message says that the job was evaluating, not training.
        code, stderr = self.signal_rank_1_during_an_evaluation("hung", signal.SIGSTOP)
        self.assertEqual(code, 3, stderr)
        self.assertRegex(stderr, r"mantissa: rank 0: .* did not complete within 4(\.\d+)? s "
                                 r"\(dist\.timeout_s\) while evaluating after step 4/2000; "
                                 r"rank\(s\) \[1\] did not answer")

    def test_bad_settings_name_the_field(self):
        config = self.write("eval.pbtxt", CONFIG)
        cases = [
            ("run.eval_every=-1", "run.eval_every = -1: must be >= 0"),
            ("data.text_file.val_fraction=1", "data.text_file.val_fraction = 1: must lie in [0, 1)"),
            ("run.eval_tokens=10", "run.eval_tokens = 10: must be >= model.gpt2.seq_len = 64"),
            ("data.text_file.val_fraction=0",
             "run.eval_every = 10: needs a validation set (data.synthetic.val_tokens, "
             "data.text_file.val_fraction or data.token_shards.val_pattern)"),
        ]
        for setting, message in cases:
            result = self.mantissa("config", "--config", config, "--set", setting)
            self.assertEqual(result.returncode, 2, setting)
            self.assertIn(message, result.stderr, setting)
        missing = os.path.join(self.dir, "none_*.bin")
        result = self.mantissa("config", "--config", config, "--set",
                               f"data.token_shards.pattern={os.path.join(LICENSES, 'GPL-3')}",
                               "--set",
                               f"data.token_shards.val_pattern={missing}")
        self.assertEqual(result.returncode, 2)
        self.assertIn(f'data.token_shards.val_pattern = "{missing}": matches no file',
                      result.stderr)
        # A held-out part, or a training part, too small for one window is found when the text
        # is read: the message names the settings that fix it.
        for fraction, message in (
                ("0.0001", r"validation set licenses.txt \(validation\): \d+ tokens hold no whole "
                           r"window of seq_len \+ 1 = 65 tokens; hold out more "
                           r"\(data.text_file.val_fraction\) or evaluate nothing "
                           r"\(run.eval_every=0\)"),
                ("0.9999", r"data 'licenses.txt': no segment holds seq_len \+ 1 = 65 tokens \(the "
                           r"longest has \d+\); lower model.gpt2.seq_len, or train on a longer "
                           r"text \(data.text_file.path\), or hold out less "
                           r"\(data.text_file.val_fraction = 0.9999 keeps that part of the "
                           r"text's end for evaluation\)")):
            result = self.mantissa("train", "--config", config, "--set", "run.dir=small", "--set",
                                   f"data.text_file.val_fraction={fraction}")
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertRegex(result.stderr, message)
            self.assertFalse(os.path.exists(os.path.join(self.dir, "small")))
        # A resumed GPT-2's seq_len is its checkpoint's: lowering it is no remedy there.
        self.train("resumed", "run.steps=1", "run.eval_every=0")
        result = self.mantissa("train", "--config", config, "--set", "run.dir=resumed", "--set",
                               "run.steps=2", "--set", "data.text_file.val_fraction=0.9999")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, r"\(the longest has \d+\); train on a longer text "
                                        r"\(data.text_file.path\), or hold out less")
        self.assertNotIn("seq_len, or", result.stderr)
        # One whose seq_len was raised past the text is told the checkpoint's, which the text
        # holds. checkpoint.resume NEVER starts afresh, where a lower seq_len is a remedy (this
        # run.dir's checkpoints are refused next: NEVER needs a run.dir without them).
        text = self.write("short.txt", "".join(chr(ord("a") + i % 26) for i in range(300)))
        data = f'data.text_file={{path: "{text}" val_fraction: 0}}'
        self.train("raised", "run.steps=1", "run.eval_every=0", data)
        for setting, remedy in (
                ("checkpoint.resume=AUTO", "; resume with the checkpoint's model.gpt2.seq_len = "
                                           "64, or train on a longer text"),
                ("checkpoint.resume=NEVER", "; lower model.gpt2.seq_len, or train on a longer "
                                            "text")):
            result = self.mantissa("train", "--config", config, "--set", "run.dir=raised",
                                   "--set", "run.steps=2", "--set", "run.eval_every=0", "--set",
                                   data, "--set", "model.gpt2.seq_len=512", "--set", setting)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn("(the longest has 300)" + remedy, result.stderr)
        # Nor is the checkpoint's seq_len named where the data hold no window of it either.
        shorter = self.write("shorter.txt", "abcdefghij" * 4)
        result = self.mantissa("train", "--config", config, "--set", "run.dir=raised", "--set",
                               "run.steps=2", "--set", "run.eval_every=0", "--set",
                               f'data.text_file={{path: "{shorter}" val_fraction: 0}}', "--set",
                               "model.gpt2.seq_len=48")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("(the longest has 40); train on a longer text", result.stderr)

    def test_a_text_smaller_than_one_steps_batch_is_noted(self):
        # 4 windows of 64 tokens a step from a text of 256 bytes (its tokens), which holds 3
        # windows end to end (each window's last token is the next one's first): every step
        # reads the same tokens again, which the start says; 257 bytes hold 4 and need no note.
        config = self.write("eval.pbtxt", CONFIG)
        note = ("mantissa: note: the training data hold 3 window(s) of 64 tokens (256 tokens), "
                "fewer than one step reads (4): every step reads the same tokens again")
        for size, noted in ((256, True), (257, False)):
            with self.subTest(size=size):
                text = self.write(f"text{size}.txt", "".join(
                    chr(ord("a") + i % 26) for i in range(size)))
                result = self.mantissa("train", "--config", config, "--set",
                                       f"run.dir=run{size}", "--set", "run.steps=2", "--set",
                                       "run.eval_every=0", "--set", f"data.text_file={{path: "
                                       f'"{text}" val_fraction: 0}}')
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(note in result.stderr, noted, result.stderr)

    def test_a_held_out_end_that_no_evaluation_reads_is_noted(self):
        # val_fraction holds the text's end out whether or not an evaluation reads it: with
        # run.eval_every 0 nothing does, which the start says.
        config = self.write("eval.pbtxt", CONFIG)
        note = ("mantissa: note: data.text_file.val_fraction = 0.1 holds the text's end out for "
                "evaluation, and run.eval_every = 0 runs none: no step reads those tokens "
                "(val_fraction=0 trains on them)")
        for name, sets, noted in (("off", ["run.eval_every=0"], True),
                                  ("whole", ["run.eval_every=0", "data.text_file.val_fraction=0"],
                                   False),
                                  ("on", ["run.eval_every=2", "run.eval_tokens=64"], False)):
            with self.subTest(name):
                args = ["train", "--config", config, "--set", f"run.dir={name}", "--set",
                        "run.steps=2"]
                for s in sets:
                    args += ["--set", s]
                result = self.mantissa(*args)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(note in result.stderr, noted, result.stderr)


if __name__ == "__main__":
    lu.main()
