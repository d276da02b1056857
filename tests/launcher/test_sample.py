"""`mantissa sample` end to end, through the real executables:
 - on a tiny run trained on the synthetic corpus (bytes): a seed gives the same text twice,
   other seeds give other text, a prompt "-h" is text (not the help), temperature 0 is greedy (the same text whatever the seed),
   top-k 1 and a tiny top-p are greedy too; the text starts with the prompt; a prompt longer
   than seq_len and generation far past seq_len (the window slides) work; --step picks a
   checkpoint;
 - bad input exits 2 with one line that names it: no --run, a --run that is missing or a file,
   a directory without config.pbtxt, a run without a checkpoint, a step that was not saved, a
   temperature or top-k below 0, a top-p outside (0, 1], an option where a value belongs, an
   unknown option, a missing tokenizer file (data.tokenizer, or tokenizer.model beside the
   shards; a relative path says where sample must run), --device CUDA without a GPU;
 - its OpenMP threads sleep while they wait (OMP_WAIT_POLICY=passive) unless the user set a
   policy or thread binding, and the process keeps its name;
 - the help lists the options and exit codes, and `mantissa --help` lists the command;
 - the whole chain on a licence text every Debian machine has: `mantissa tokenize train` and
   `encode` with a validation split, 2 ranks under mpirun with evaluation (the validation loss
   falls), then samples that continue a UTF-8 prompt with multi-byte characters, through the
   tokenizer beside the shards and through data.tokenizer, and never hold <unk>.
"""

import os
import re
import shutil
import select
import struct
import subprocess
import tempfile
import time
import unittest

import launcher_util as lu

LICENCE = "/usr/share/common-licenses/GPL-3"


def run_sample(*args, timeout=120):
    """mantissa sample with bytes out (the text of a byte-level model need not be UTF-8)."""
    return subprocess.run([lu.binary(), "sample", *args], env=lu.environment(), timeout=timeout,
                          capture_output=True)


class TinyRun(unittest.TestCase):
    """One tiny GPT trained on the synthetic corpus (vocab 256, seq_len 64), checkpoints at
    steps 20, 40 and 60, shared by the tests."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mantissa_sample_")
        cls.run_dir = os.path.join(cls.dir, "run")
        config = os.path.join(cls.dir, "tiny.pbtxt")
        with open(config, "w") as f:
            f.write(lu.TINY_GPT)
        result = subprocess.run([lu.binary(), "train", "--config", config, "--progress", "lines",
                                 "--set", f"run.dir={cls.run_dir}"], env=lu.environment(),
                                timeout=240, capture_output=True, text=True)
        if result.returncode != 0:
            raise AssertionError(f"training failed: {result.stderr}")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def sample(self, *args):
        result = run_sample("--run", self.run_dir, *args)
        self.assertEqual(result.returncode, 0, result.stderr.decode(errors="replace"))
        return result

    def text(self, *args):
        return self.sample(*args).stdout

    def test_a_seed_repeats_and_other_seeds_differ(self):
        first = self.text("--prompt", "the red fox", "--seed", "7", "--max-new-tokens", "80")
        self.assertEqual(first, self.text("--prompt", "the red fox", "--seed", "7",
                                          "--max-new-tokens", "80"))
        self.assertTrue(first.startswith(b"the red fox"), first)
        self.assertEqual(len(first), len("the red fox") + 80 + 1, "prompt, 80 bytes, a newline")
        self.assertTrue(first.endswith(b"\n"))
        others = {self.text("--prompt", "the red fox", "--seed", str(s), "--max-new-tokens", "80")
                  for s in (8, 9)}
        self.assertNotIn(first, others)
        self.assertEqual(len(others), 2)

    def test_a_prompt_that_reads_like_an_option(self):
        # "-h" where a value belongs is the prompt, not a request for help.
        text = self.text("--prompt", "-h", "--max-new-tokens", "5")
        self.assertTrue(text.startswith(b"-h"), text)
        self.assertEqual(len(text), len("-h") + 5 + 1)

    def test_temperature_zero_is_greedy(self):
        greedy = self.text("--temperature", "0", "--seed", "1", "--max-new-tokens", "60")
        self.assertEqual(greedy, self.text("--temperature", "0", "--seed", "2",
                                           "--max-new-tokens", "60"))
        self.assertEqual(greedy, self.text("--top-k", "1", "--seed", "3", "--max-new-tokens", "60"))
        # So is a top-p so small that the most likely token alone reaches it.
        self.assertEqual(greedy, self.text("--top-p", "1e-9", "--seed", "4",
                                           "--max-new-tokens", "60"))
        # An empty prompt starts from a newline, which is not printed.
        self.assertEqual(len(greedy), 61)

    def test_the_model_learned_something(self):
        # After 60 steps on the synthetic corpus the greedy continuation of a sentence is made of
        # the corpus's 41 characters (lowercase words, the digits of its count and sum lines,
        # "+=. " and newlines), not random bytes, of which about 16% would be.
        text = self.text("--prompt", "the", "--temperature", "0", "--max-new-tokens", "40")
        letters = sum(c in b"abcdefghijklmnopqrstuvwxyz0123456789+=. \n" for c in text)
        self.assertGreater(letters / len(text), 0.8, text)

    def test_long_prompt_and_generation_past_the_window(self):
        prompt = "the quick fox sees a dog. " * 6  # 156 bytes, seq_len is 64
        result = self.sample("--prompt", prompt, "--max-new-tokens", "300", "--seed", "4")
        self.assertTrue(result.stdout.startswith(prompt.encode()))
        self.assertEqual(len(result.stdout), len(prompt) + 300 + 1)
        stderr = result.stderr.decode()
        self.assertIn("a prompt of 156 tokens (its last 64 in the window), 300 new", stderr)
        self.assertRegex(stderr, r"300 tokens in [0-9.]+ s \([0-9.]+ tokens/s\)")

    def test_text_shows_while_it_is_generated(self):
        # A generation far too long to wait for: its start is on stdout long before its end,
        # and what was shown is kept when it is stopped.
        process = subprocess.Popen(
            [lu.binary(), "sample", "--run", self.run_dir, "--prompt", "the red fox",
             "--max-new-tokens", "100000000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=lu.environment())
        try:
            shown = b""
            deadline = time.monotonic() + 60
            while len(shown) < len("the red fox") + 20:
                ready, _, _ = select.select([process.stdout], [], [],
                                            max(0, deadline - time.monotonic()))
                self.assertTrue(ready, f"only {shown!r} on stdout after 60 s")
                chunk = process.stdout.read1(4096)
                self.assertTrue(chunk, "stdout closed early")
                shown += chunk
        finally:
            process.kill()
            process.wait(timeout=60)
        self.assertTrue(shown.startswith(b"the red fox"), shown)

    def running_process(self, **env):
        """The environment and name of `mantissa sample` once it generates (read from /proc
        while it prints), started with lu.environment() less OMP_WAIT_POLICY, plus `env`."""
        environment = lu.environment(**env)
        if "OMP_WAIT_POLICY" not in env:
            environment.pop("OMP_WAIT_POLICY", None)
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(
                [lu.binary(), "sample", "--run", self.run_dir, "--max-new-tokens", "100000000"],
                stdout=subprocess.PIPE, stderr=stderr, env=environment)
            try:
                ready, _, _ = select.select([process.stdout], [], [], 60)
                text = process.stdout.read1(4096) if ready else b""
                if not text:
                    stderr.seek(0)
                    self.fail(f"no text after 60 s (ready: {bool(ready)}); stderr:\n"
                              f"{stderr.read().decode()}")
                with open(f"/proc/{process.pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
                with open(f"/proc/{process.pid}/comm") as f:
                    name = f.read().strip()
                return environ, name
            finally:
                process.kill()
                process.wait(timeout=60)

    def test_openmp_threads_sleep_while_they_wait_unless_told_otherwise(self):
        environ, name = self.running_process()
        self.assertIn(b"OMP_WAIT_POLICY=passive", environ)
        self.assertEqual(name, "mantissa")  # started again by its own path, not /proc/self/exe
        told, _ = self.running_process(OMP_WAIT_POLICY="active")
        self.assertIn(b"OMP_WAIT_POLICY=active", told)
        self.assertNotIn(b"OMP_WAIT_POLICY=passive", told)
        # With thread binding libgomp has pinned the thread to one place before main: a process
        # started again would keep that place's CPUs only, so sample keeps its start.
        bound, _ = self.running_process(OMP_PROC_BIND="true")
        self.assertFalse([v for v in bound if v.startswith(b"OMP_WAIT_POLICY=")], bound)

    def test_step_picks_a_checkpoint(self):
        newest = self.sample("--max-new-tokens", "5").stderr.decode()
        self.assertIn(os.path.join("checkpoints", "step_00000060") + " (step 60)", newest)
        older = self.sample("--step", "20", "--max-new-tokens", "5").stderr.decode()
        self.assertIn(os.path.join(self.run_dir, "checkpoints", "step_00000020") + " (step 20)", older)
        self.assertIn("bytes", older)

    def bad(self, *args, run=True):
        result = run_sample(*(["--run", self.run_dir] if run else []), *args)
        stderr = result.stderr.decode()
        self.assertEqual(result.returncode, 2, stderr)
        self.assertEqual(result.stdout, b"")
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        return stderr

    def test_bad_input_exits_2_naming_it(self):
        self.assertIn("needs --run DIR", self.bad(run=False))
        self.assertIn("--temperature -0.5: must be >= 0", self.bad("--temperature", "-0.5"))
        self.assertIn("--top-k -1: must be >= 0", self.bad("--top-k", "-1"))
        self.assertIn("--top-p 0: must lie in (0, 1]", self.bad("--top-p", "0"))
        self.assertIn("--top-p 1.5: must lie in (0, 1]", self.bad("--top-p", "1.5"))
        self.assertIn("--run needs a value, but the next argument is the option '--seed'",
                      self.bad("--run", "--seed", "3", run=False))
        self.assertIn("unknown argument '--topk'", self.bad("--topk", "3"))
        self.assertIn("--max-new-tokens given twice",
                      self.bad("--max-new-tokens", "1", "--max-new-tokens", "2"))
        self.assertIn("--max-new-tokens 'many': takes an integer",
                      self.bad("--max-new-tokens", "many"))
        self.assertIn("--step 30: no checkpoint", self.bad("--step", "30"))
        self.assertIn("the steps saved: 20, 40, 60", self.bad("--step", "30"))
        self.assertIn("--device 'TPU': takes AUTO, CPU or CUDA", self.bad("--device", "TPU"))
        self.assertIn("--end-of-text 'STOP': takes mark or stop",
                      self.bad("--end-of-text", "STOP"))
        nowhere = os.path.join(self.dir, "nowhere")
        self.assertIn(f"--run {nowhere}: no such directory", self.bad("--run", nowhere, run=False))
        config = os.path.join(self.run_dir, "config.pbtxt")
        self.assertIn(f"--run {config}: is not a directory (--run takes a run.dir)",
                      self.bad("--run", config, run=False))
        self.assertIn(f"--run {self.dir}: has no config.pbtxt",
                      self.bad("--run", self.dir, run=False))
        odd = os.path.join(self.dir, "odd")
        os.makedirs(os.path.join(odd, "config.pbtxt"))
        self.assertIn(f"--run {odd}: has a config.pbtxt that is not a regular file",
                      self.bad("--run", odd, run=False))

    def test_a_bad_cpu_switch_exits_2_naming_it(self):
        result = subprocess.run([lu.binary(), "sample", "--run", self.run_dir],
                                env=lu.environment(MANTISSA_CPU_AMX="yes"), timeout=120,
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr, "mantissa: environment: MANTISSA_CPU_AMX=yes: must be 0 "
                                        "(off) or 1 (on, the default)\n")

    def test_a_run_without_checkpoint(self):
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty, exist_ok=True)
        shutil.copy(os.path.join(self.run_dir, "config.pbtxt"), empty)
        stderr = self.bad("--run", empty, run=False)
        self.assertIn(f"--run {empty}: holds no checkpoint ({empty}/checkpoints does not exist)",
                      stderr)

    def test_cuda_without_a_gpu(self):
        if os.path.exists("/dev/nvidia0"):
            self.skipTest("a GPU is visible")
        self.assertIn("--device CUDA: no CUDA device", self.bad("--device", "CUDA"))

    def copy_run(self, name, replace):
        """A copy of the run whose config.pbtxt has `replace` applied: (old, new) pairs."""
        copy = os.path.join(self.dir, name)
        shutil.copytree(self.run_dir, copy)
        path = os.path.join(copy, "config.pbtxt")
        with open(path) as f:
            config = f.read()
        for old, new in replace:
            self.assertIn(old, config)
            config = config.replace(old, new)
        with open(path, "w") as f:
            f.write(config)
        return copy

    def test_missing_tokenizer_files_are_named(self):
        missing = os.path.join(self.dir, "missing.model")
        run = self.copy_run("with_tokenizer", [('tokenizer: ""', f'tokenizer: "{missing}"')])
        stderr = self.bad("--run", run, run=False)
        self.assertIn(f'data.tokenizer = "{missing}": no such file', stderr)
        self.assertNotIn("relative", stderr)
        run = self.copy_run("with_relative_tokenizer",
                            [('tokenizer: ""', 'tokenizer: "not_here/tok.model"')])
        self.assertIn('data.tokenizer = "not_here/tok.model": no such file, named by the run\'s '
                      "config (a path relative to the directory mantissa train ran in: run "
                      "mantissa sample from there)", self.bad("--run", run, run=False))

        # A run on token shards of vocab 512 without a tokenizer.model beside them (the error
        # comes before any checkpoint is read).
        shards = os.path.join(self.dir, "shards")
        run = os.path.join(self.dir, "on_shards")
        os.makedirs(run, exist_ok=True)
        with open(os.path.join(run, "config.pbtxt"), "w") as f:
            f.write(f"""
model {{ gpt2 {{ n_layer: 2 n_head: 2 n_embd: 64 seq_len: 64 vocab_size: 512 }} }}
data {{ token_shards {{ pattern: "{shards}/train_*.bin" }} }}
""")
        stderr = self.bad("--run", run, run=False)
        self.assertIn(os.path.join(shards, "tokenizer.model") + " is missing", stderr)
        self.assertNotIn("relative", stderr)
        os.makedirs(os.path.join(shards, "tokenizer.model"))
        self.assertIn(os.path.join(shards, "tokenizer.model") + " is not a regular file",
                      self.bad("--run", run, run=False))
        os.removedirs(os.path.join(shards, "tokenizer.model"))  # and the empty shards/
        # A relative path is taken from the current directory, as train took it: the message
        # says so, and where to run sample from.
        with open(os.path.join(run, "config.pbtxt"), "w") as f:
            f.write("""
model { gpt2 { n_layer: 2 n_head: 2 n_embd: 64 seq_len: 64 vocab_size: 512 } }
data { token_shards { pattern: "not_here/train_*.bin" } }
""")
        stderr = self.bad("--run", run, run=False)
        self.assertIn("not_here/tokenizer.model is missing (a path relative to the directory "
                      "mantissa train ran in: run mantissa sample from there)", stderr)

    def train_on_shards_of(self, vocab):
        """A one-step run on token shards of ids below `vocab` without a tokenizer (bytes)."""
        shards = os.path.join(self.dir, f"shards{vocab}")
        os.makedirs(shards)
        tokens = [(7 * i) % vocab for i in range(4096)]
        with open(os.path.join(shards, "train_000000.bin"), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        config = os.path.join(self.dir, f"vocab{vocab}.pbtxt")
        run = os.path.join(self.dir, f"vocab{vocab}")
        with open(config, "w") as f:
            f.write(f"""
run {{ steps: 1 device: CPU dir: "{run}" }}
model {{ gpt2 {{ n_layer: 1 n_head: 2 n_embd: 32 seq_len: 16 vocab_size: {vocab} }} }}
data {{ token_shards {{ pattern: "{shards}/train_*.bin" }} micro_batch_size: 2 }}
precision {{ mode: FP32 }}
""")
        result = subprocess.run([lu.binary(), "train", "--config", config],
                                env=lu.environment(), timeout=120, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        return run

    def test_a_prompt_byte_past_a_small_vocabulary_is_refused(self):
        # Shards of 100 ids without a tokenizer are bytes: "z" (122) has no token; "ab" (97, 98)
        # has. With 10 ids, the newline an empty prompt starts from has none either.
        run = self.train_on_shards_of(100)
        self.assertIn("--prompt 'az': byte 1 is 122, past the model's vocabulary of 100 ids "
                      "(each byte is a token)", self.bad("--run", run, "--prompt", "az",
                                                         run=False))
        self.assertEqual(run_sample("--run", run, "--prompt", "ab", "--max-new-tokens",
                                    "2").returncode, 0)
        self.assertIn("--prompt '': an empty prompt starts from a newline (10), which a "
                      "vocabulary of 10 ids lacks: give a prompt",
                      self.bad("--run", self.train_on_shards_of(10), run=False))

    def test_help_tells_the_options_and_exit_codes(self):
        result = subprocess.run([lu.binary(), "sample", "--help"], capture_output=True, text=True,
                                timeout=30)
        self.assertEqual(result.returncode, 0)
        for option in ("--run DIR", "--step N", "--prompt TEXT", "--max-new-tokens N",
                       "--temperature T", "--top-k K", "--seed S", "--device D", "--help"):
            self.assertIn(option, result.stdout)
        codes = re.findall(r"^  (\d)  ", result.stdout.split("exit codes:", 1)[1], re.MULTILINE)
        self.assertEqual(codes, ["0", "1", "2"])
        overview = subprocess.run([lu.binary(), "--help"], capture_output=True, text=True,
                                  timeout=30)
        self.assertRegex(overview.stdout, r"\n  sample +generate text")


class Chain(lu.TempDirTest):
    """Text file to samples: tokenizer, shards with a validation split, 2 ranks, sample."""

    def test_licence_text_to_samples(self):
        tokenizer = os.path.join(self.dir, "tok.model")
        shards = os.path.join(self.dir, "shards")
        for args in (["train", "--input", LICENCE, "--vocab-size", "512", "--out", tokenizer],
                     ["encode", "--tokenizer", tokenizer, "--input", LICENCE, "--out-dir", shards,
                      "--val-fraction", "0.1"]):
            result = self.mantissa("tokenize", *args, timeout=240)
            self.assertEqual(result.returncode, 0, result.stderr)

        run = os.path.join(self.dir, "run")
        config = self.write("own.pbtxt", f"""
run {{ steps: 30 seed: 2 device: CPU log_every: 10 eval_every: 10 eval_tokens: 2048
      dir: "{run}" }}
model {{ gpt2 {{ n_layer: 2 n_head: 2 n_embd: 64 seq_len: 64 vocab_size: 512 }} }}
data {{ token_shards {{ pattern: "{shards}/train_*.bin" val_pattern: "{shards}/val_*.bin" }}
       micro_batch_size: 4 }}
optimizer {{ adamw {{ lr: 0.003 weight_decay: 0 }} warmup_steps: 3 }}
precision {{ mode: FP32 }}
checkpoint {{ every_steps: 30 }}
""")
        result = self.mantissa("train", "--config", config, "--progress", "lines", ranks=2,
                               timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        val = [e["val_loss"] for e in lu.read_log(run, 0) if "val_loss" in e]
        self.assertEqual(len(val), 3)
        self.assertLess(val[-1], val[0], f"the validation loss should fall: {val}")

        prompt = "Déjà vu — the GNU General Public License"
        args = ["--prompt", prompt, "--max-new-tokens", "100", "--seed", "3"]
        first = run_sample("--run", run, *args)
        self.assertEqual(first.returncode, 0, first.stderr.decode(errors="replace"))
        text = first.stdout.decode("utf-8")  # decodes: the tokenizer writes whole characters
        self.assertTrue(text.startswith(prompt), text)
        self.assertGreater(len(text), len(prompt) + 20, text)
        self.assertIn("tokenizer " + os.path.join(shards, "tokenizer.model"),
                      first.stderr.decode())
        self.assertEqual(first.stdout, run_sample("--run", run, *args).stdout)

        # data.tokenizer names the model elsewhere: the same text.
        elsewhere = os.path.join(self.dir, "elsewhere.model")
        os.rename(os.path.join(shards, "tokenizer.model"), elsewhere)
        path = os.path.join(run, "config.pbtxt")
        with open(path) as f:
            config_text = f.read()
        with open(path, "w") as f:
            f.write(config_text.replace('tokenizer: ""', f'tokenizer: "{elsewhere}"'))
        second = run_sample("--run", run, *args)
        self.assertEqual(second.returncode, 0, second.stderr.decode(errors="replace"))
        self.assertEqual(second.stdout, first.stdout)
        self.assertIn("tokenizer " + elsewhere, second.stderr.decode())
        greedy = run_sample("--run", run, "--temperature", "0", "--max-new-tokens", "40")
        self.assertEqual(greedy.returncode, 0, greedy.stderr.decode(errors="replace"))
        greedy.stdout.decode("utf-8")
        # <unk> and <s> are never drawn, even from a nearly flat distribution (at temperature 5
        # each of the 512 ids has about 1/512 a draw: over 4000 draws <unk>, which
        # SentencePiece prints as " \u2047 ", would show about 8 times).
        hot_args = ("--run", run, "--temperature", "5", "--max-new-tokens", "4000", "--seed", "1")
        hot = run_sample(*hot_args)
        self.assertEqual(hot.returncode, 0, hot.stderr.decode(errors="replace"))
        text = hot.stdout.decode("utf-8")
        self.assertNotIn("\u2047", text)
        # End of text (about 8 draws too) marks where a document ended, or ends the generation
        # there: the same draws up to the first one.
        mark = "<|endoftext|>"
        self.assertIn(mark, text)
        stopped = run_sample(*hot_args, "--end-of-text", "stop")
        self.assertEqual(stopped.returncode, 0, stopped.stderr.decode(errors="replace"))
        self.assertEqual(stopped.stdout.decode("utf-8"), text[:text.index(mark) + len(mark)] + "\n")


if __name__ == "__main__":
    lu.main()
