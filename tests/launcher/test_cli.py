"""The mantissa command line, through the real binary (one rank, no mpirun):
 - every config error path (unknown field, bad enum, out-of-range value, missing or malformed
   data, incompatible options, bad command line) exits with code 2 and exactly one line on
   stderr that names the problem;
 - --set reaches nested fields, enums, bools, repeated fields and oneof members;
 - --help output lists every subcommand, and `mantissa train --help` documents the options,
   the exit codes and the defaults.
(`mantissa export` and model.init_from working end to end: test_train.py.)
"""

import fcntl
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess

import launcher_util as lu

BASE = """
run { steps: 4 device: CPU log_every: 1 }
model { mlp { n_embd: 32 hidden: 64 seq_len: 16 } }
data { synthetic { n_tokens: 65536 } micro_batch_size: 4 }
"""


class ConfigErrors(lu.TempDirTest):
    def assert_config_error(self, expected, *args, config=BASE, env=None, command="train"):
        """Runs `mantissa COMMAND --config c.pbtxt ARGS`; expects exit 2 and one stderr line
        equal to `expected` (a str) or matching it (a compiled regex)."""
        path = self.write("c.pbtxt", config)
        result = self.mantissa(command, "--config", path, *args, env=env)
        lines = result.stderr.splitlines()
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(len(lines), 1, f"expected one line on stderr, got:\n{result.stderr}")
        if isinstance(expected, str):
            self.assertEqual(lines[0], expected.replace("{path}", path).replace("{dir}", self.dir))
        else:
            self.assertRegex(lines[0], expected)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "runs", "c", "log")),
                         "nothing may be trained after a config error")
        return lines[0]

    def test_unknown_field_in_file(self):
        self.assert_config_error(
            "mantissa: {path}:2:3: run has no field 'stepz' (fields: steps, seed, dir, device, "
            "log_every, eval_every, eval_tokens)", config="run {\n  stepz: 5\n}\n")

    def test_bad_enum_in_file(self):
        self.assert_config_error(
            "mantissa: {path}:2:9: precision.mode must be one of FP32, BF16, FP16, FP8_HYBRID, "
            "got 'FP7'", config="precision {\n  mode: FP7\n}\n")

    def test_enum_number_out_of_range_in_file(self):
        # Proto3 parses any number for an enum; it ran as FP32 (the translation's default).
        self.assert_config_error(
            "mantissa: precision.mode = 7: is none of FP32, BF16, FP16, FP8_HYBRID",
            config="precision { mode: 7 }")
        self.assert_config_error(
            "mantissa: dist.grad_reduce_dtype = 9: is none of " + ", ".join(
                self.enum_names("ReduceDtype")), config="dist { grad_reduce_dtype: 9 }")

    def enum_names(self, enum):
        with open(os.path.join(lu.ARGS.source_dir, "proto", "config.proto")) as f:
            text = f.read()
        body = text[text.index(f"enum {enum} {{"):]
        body = body[:body.index("}")]
        return re.findall(r"^\s*(\w+) = \d+;", body, re.MULTILINE)

    def test_metrics_settings_that_would_fail_at_start(self):
        self.assert_config_error(
            'mantissa: metrics.bind_address = "localhost": must be an IPv4 address to listen on, '
            "e.g. 127.0.0.1 or 0.0.0.0 (not a host name)",
            "--set", "metrics.port=19333", "--set", "metrics.bind_address=localhost",
            command="config")
        self.assert_config_error(
            "mantissa: metrics.push_every = 4294967297: must lie in [1, 2147483647]",
            "--set", "metrics.push_every=4294967297", command="config")

    def test_syntax_error_in_file(self):
        self.assert_config_error(re.compile(r"^mantissa: .*c\.pbtxt:2:\d+: "),
                                 config="run { steps: 4\n")

    def test_unknown_field_in_set(self):
        self.assert_config_error(
            "mantissa: --set precision.loss_scale.grwth=2: precision.loss_scale has no field "
            "'grwth' (fields: mode, init, growth_factor, backoff_factor, growth_interval, "
            "hysteresis, min, max, max_overflows_at_min)",
            "--set", "precision.loss_scale.grwth=2")

    def test_bad_enum_in_set(self):
        self.assert_config_error(
            "mantissa: --set precision.mode=FP7: mode must be one of FP32, BF16, FP16, "
            "FP8_HYBRID, got 'FP7'", "--set", "precision.mode=FP7")

    def test_bad_number_in_set(self):
        self.assert_config_error(
            "mantissa: --set run.steps=many: steps takes an integer (int64), got 'many'",
            "--set", "run.steps=many")

    def test_out_of_range_values(self):
        cases = {
            "precision.loss_scale.growth_factor=0.5":
                "precision.loss_scale.growth_factor = 0.5: must be > 1",
            "optimizer.adamw.beta1=1.5": "optimizer.adamw.beta1 = 1.5: must lie in [0, 1)",
            "run.steps=0": "run.steps = 0: must be >= 1",
            "dist.zero_stage=2": "dist.zero_stage = 2: must lie in [0, 1]",
            "model.mlp.vocab_size=100":
                "model.mlp.vocab_size = 100: must be >= 256, the byte vocabulary of "
                "data.synthetic",
            "metrics.job=a/b": 'metrics.job = "a/b": must be a name of letters, digits and '
                               "_ . : - (the Pushgateway's job label)",
            "metrics.job=..": 'metrics.job = "..": must not be . or .. (a URL would drop it '
                              "from the push's path)",
        }
        for setting, message in cases.items():
            with self.subTest(setting):
                self.assert_config_error("mantissa: " + message, "--set", setting)

    def test_error_in_config_command_too(self):
        self.assert_config_error("mantissa: run.steps = 0: must be >= 1", "--set", "run.steps=0",
                                 command="config")

    def test_config_get_prints_one_value_as_it_is(self):
        # For scripts (deploy/slurm): a string without quotes or the text format's escapes.
        path = self.write("c.pbtxt", BASE)
        odd_dir = 'runs/d\u00e9"mo\\x'
        result = self.mantissa("config", "--config", path, "--set", f"run.dir={odd_dir}",
                               "--get", "run.dir")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, odd_dir + "\n")
        result = self.mantissa("config", "--config", path, "--get", "run.steps")
        self.assertEqual((result.returncode, result.stdout), (0, "4\n"), result.stderr)
        for unused in ("model.llama.n_layer", "model.llama"):
            self.assert_config_error(
                f"mantissa: --get {unused}: the config does not use it (another member of its "
                "oneof is selected)", "--get", unused, command="config")
        result = self.mantissa("config", "--config", path, "--get", "model.mlp")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(result.stdout.startswith("n_embd: 32\n"), result.stdout)
        self.assertFalse(result.stdout.endswith("\n\n"), result.stdout)
        self.assert_config_error("mantissa: --get needs a field's path (see mantissa config "
                                 "--help)", "--get=", command="config")

    def test_missing_config_file(self):
        result = self.mantissa("train", "--config", "missing.pbtxt")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.splitlines(),
                         ["mantissa: config 'missing.pbtxt': cannot open: No such file or directory"])

    def test_missing_text_file(self):
        self.assert_config_error(
            'mantissa: data.text_file.path = "/nonexistent/corpus.txt": cannot be read: No such '
            'file or directory', "--set", "data.text_file.path=/nonexistent/corpus.txt")

    def test_token_shards_matching_nothing(self):
        self.assert_config_error(
            'mantissa: data.token_shards.pattern = "{dir}/shards/*.bin": matches no file',
            "--set", f"data.token_shards.pattern={self.dir}/shards/*.bin")

    def test_relative_paths_naming_nothing_say_where_they_were_looked_for(self):
        # Taken from the directory mantissa runs in ({dir}), not the config file's.
        self.assert_config_error(
            'mantissa: data.token_shards.pattern = "shards/*.bin": matches no file (relative '
            'paths are taken from the current directory, {dir})',
            "--set", "data.token_shards.pattern=shards/*.bin")
        self.assert_config_error(
            'mantissa: data.text_file.path = "corpus.txt": cannot be read: No such file or '
            'directory (relative paths are taken from the current directory, {dir})',
            "--set", "data.text_file.path=corpus.txt")

    def test_token_shards_matching_a_directory(self):
        os.makedirs(os.path.join(self.dir, "shards", "train_000000.bin"))
        self.assert_config_error(
            'mantissa: data.token_shards.pattern = "{dir}/shards/*.bin": matches the directory '
            '{dir}/shards/train_000000.bin/: a glob of token shard files must match files',
            "--set", f"data.token_shards.pattern={self.dir}/shards/*.bin")

    def test_validation_shards_that_are_training_shards(self):
        # The files are not read: the globs are compared first. The second spelling of the
        # directory ("shards/../shards") names the same file.
        os.makedirs(os.path.join(self.dir, "shards"))
        for name in ("train_000000.bin", "val_000000.bin"):
            open(os.path.join(self.dir, "shards", name), "wb").close()
        self.assert_config_error(
            'mantissa: data.token_shards.val_pattern = "{dir}/shards/../shards/val_*.bin": matches '
            '{dir}/shards/../shards/val_000000.bin, which data.token_shards.pattern = '
            '"{dir}/shards/*.bin" matches too: the run would be evaluated on tokens it trains on '
            '(tokenize encode writes train_*.bin and val_*.bin: give each its own glob)',
            "--set", f'data.token_shards={{pattern: "{self.dir}/shards/*.bin" '
                     f'val_pattern: "{self.dir}/shards/../shards/val_*.bin"}}')

    def test_malformed_token_shard(self):
        shard = os.path.join(self.dir, "bad_000.bin")
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", *([12345, 1, 4] + [0] * 253)) + b"\0" * 8)
        # The data source selected as a whole (no note about the synthetic data it replaces).
        self.assert_config_error(
            f"mantissa: token shard '{shard}': bad magic 12345 (expected 20240520 or, for uint32 "
            "tokens, 20240801; not an llm.c token shard)",
            "--set", f'data.token_shards={{pattern: "{shard}"}}')

    def test_nccl_on_a_cpu_rank(self):
        self.assert_config_error(
            "mantissa: dist.backend = NCCL: needs a CUDA device, and this rank runs on the CPU "
            "(use MPI or AUTO)", "--set", "dist.backend=NCCL")

    def test_cuda_without_a_visible_gpu(self):
        self.assert_config_error(re.compile(r"^mantissa: run\.device = CUDA: (no CUDA device is "
                                            r"visible|this build has no CUDA backend)"),
                                 "--set", "run.device=CUDA",
                                 env=lu.environment(CUDA_VISIBLE_DEVICES=""))

    def test_cpu_switch_with_a_value_other_than_0_or_1(self):
        self.assert_config_error(
            "mantissa: environment: MANTISSA_CPU_AVX512_CONVERT=off: must be 0 (off) or 1 (on, "
            "the default)", env=lu.environment(MANTISSA_CPU_AVX512_CONVERT="off"))

    def test_mpi_start_timeout_that_is_no_number_of_seconds(self):
        # 1e10 s: a deadline in nanoseconds past int64 ended every start at once.
        for value in ("soon", "-1", "nan", "", "1e10"):
            with self.subTest(value):
                self.assert_config_error(
                    f"mantissa: environment: MANTISSA_MPI_START_TIMEOUT_S={value}: must be a "
                    "number of seconds from 0 (no bound) to 1e9",
                    env=lu.environment(MANTISSA_MPI_START_TIMEOUT_S=value))

    def test_amx_switch_with_a_value_other_than_0_or_1(self):
        self.assert_config_error(
            "mantissa: environment: MANTISSA_CPU_AMX=no: must be 0 (off) or 1 (on, the default)",
            env=lu.environment(MANTISSA_CPU_AMX="no"))

    def test_progress_thread_switch_with_a_value_other_than_0_or_1(self):
        self.assert_config_error(
            "mantissa: environment: MANTISSA_MPI_PROGRESS_THREAD=off: must be 0 (off) or 1 (on, "
            "the default)", env=lu.environment(MANTISSA_MPI_PROGRESS_THREAD="off"))

    def test_fault_injection_on_a_rank_that_does_not_exist(self):
        self.assert_config_error(
            "mantissa: debug.inject_nonfinite_rank = 1: must be < the world size 1",
            "--set", "debug.inject_nonfinite_rank=1", "--set", "debug.inject_nonfinite_steps=2")

    def test_resume_required_without_checkpoint(self):
        self.assert_config_error(
            "mantissa: checkpoint.resume = REQUIRED: there is no checkpoint: "
            "{dir}/run/checkpoints does not exist",
            "--set", "checkpoint.resume=REQUIRED", "--set", f"run.dir={self.dir}/run")
        # The run directory this failed start created is gone again.
        self.assertFalse(os.path.exists(os.path.join(self.dir, "run")))
        # So are the parents it created, here runs/ and runs/deep/.
        self.assert_config_error(
            "mantissa: checkpoint.resume = REQUIRED: there is no checkpoint: "
            "{dir}/runs/deep/run/checkpoints does not exist",
            "--set", "checkpoint.resume=REQUIRED", "--set", f"run.dir={self.dir}/runs/deep/run")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "runs")))
        # A dangling symlink on the way is the user's: the failed start leaves it.
        os.symlink(os.path.join(self.dir, "nowhere"), os.path.join(self.dir, "link"))
        result = self.mantissa("train", "--config", self.write("c.pbtxt", BASE), "--set",
                               f"run.dir={self.dir}/link/run")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f'run.dir = "{self.dir}/link/run": cannot be created', result.stderr)
        self.assertTrue(os.path.islink(os.path.join(self.dir, "link")))

    def test_init_from_errors(self):
        self.assert_config_error(
            'mantissa: model.init_from = "/nonexistent/gpt2.bin": cannot be read: No such file '
            'or directory', "--set", "model.gpt2={}", "--set", "model.init_from=/nonexistent/gpt2.bin")
        # A named pipe would wait for a writer for ever when opened: refused before.
        pipe = os.path.join(self.dir, "pipe.bin")
        os.mkfifo(pipe)
        self.assert_config_error(
            f'mantissa: model.init_from = "{pipe}": is not a regular file (a pipe or a device: '
            'write it to a file first)', "--set", "model.gpt2={}", "--set",
            f"model.init_from={pipe}")
        model = self.write("gpt2.bin", "")
        self.assert_config_error(
            f'mantissa: model.init_from = "{model}": needs model.gpt2 (llm.c model files hold '
            f'GPT-2 weights; Llama weights come from a Hugging Face model directory)', "--set",
            f"model.init_from={model}")
        # A directory is a Hugging Face model: GPT-2 or Llama, with its two files.
        hf = os.path.join(self.dir, "hf")
        os.makedirs(hf)
        self.assert_config_error(
            f'mantissa: model.init_from = "{hf}": is a Hugging Face model directory, which needs '
            f'model.gpt2 or model.llama', "--set", f"model.init_from={hf}")
        self.assert_config_error(
            f'mantissa: model.init_from = "{hf}/model.safetensors": cannot be read: No such file '
            f'or directory', "--set", "model.gpt2={}", "--set", f"model.init_from={hf}")
        # A safetensors file is read only in its Hugging Face directory: the directory is named
        # where config.json is beside the file.
        loose = self.write("loose.safetensors", "")
        self.assert_config_error(
            f'mantissa: model.init_from = "{loose}": a safetensors file is read only as part of a '
            "Hugging Face directory (config.json beside model.safetensors, as `mantissa export "
            "--format hf` writes); otherwise give an llm.c model file", "--set",
            "model.gpt2={}", "--set", f"model.init_from={loose}")
        # Checked with the other rules of a fresh start, so `mantissa config` refuses it too.
        self.assert_config_error(
            re.compile(r'^mantissa: model\.init_from = ".*loose\.safetensors": a safetensors '
                       'file is read only'), "--set", "model.gpt2={}", "--set",
            f"model.init_from={loose}", command="config")
        self.write("hf/config.json", "{}")
        self.write("hf/model.safetensors", "")
        self.assert_config_error(
            f'mantissa: model.init_from = "{hf}/model.safetensors": is a file of the Hugging Face '
            f"directory {hf}: name the directory", "--set", "model.gpt2={}", "--set",
            f"model.init_from={hf}/model.safetensors")
        # A file that does not hold this model: found when the Trainer imports it.
        with open(model, "wb") as f:
            f.write(struct.pack("<256i", *([20240326, 3, 16, 256, 3, 2, 32, 256] + [0] * 248)))
        self.assert_config_error(
            f'mantissa: model.init_from = "{model}": llm.c model \'{model}\': file size 1024 '
            'bytes, but the header describes 46880 FP32 parameters (188544 bytes; truncated?)',
            "--set", "model.gpt2={n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16}", "--set",
            f"model.init_from={model}")

    def test_resume_never_over_checkpoints(self):
        # A fresh start in a run.dir with checkpoints would replace them: refused, and they stay.
        saved = os.path.join(self.dir, "runs", "c", "checkpoints", "step_00000007")
        os.makedirs(saved)
        self.assert_config_error(
            "mantissa: checkpoint.resume = NEVER: runs/c/checkpoints holds checkpoints (the "
            "newest of step 7) that starting afresh would replace: choose another run.dir, or "
            "move them away", "--set", "checkpoint.resume=NEVER")
        self.assertTrue(os.path.isdir(saved))

    def test_run_dir_in_use(self):
        # Another run holds the run directory's lock (taken here as that run's rank 0 takes it).
        run_dir = os.path.join(self.dir, "runs", "c")
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.write("pid 4242 on node7\n")
            lock.flush()
            self.assert_config_error(
                'mantissa: run.dir = "runs/c": another run is using it (pid 4242 on node7); wait '
                'for it to end, or choose another run.dir')
        # Released (as the kernel releases it when its holder ends, however it ends): the run
        # starts, holds the lock itself while it runs, and empties it when it ends.
        process = self.start("train", "--config", os.path.join(self.dir, "c.pbtxt"), "--set",
                             "run.steps=1000000")
        try:
            lu.wait_for_lines(os.path.join(run_dir, "log", "rank0.jsonl"), 1, process)
            with open(os.path.join(run_dir, ".lock")) as f:
                self.assertRegex(f.read(), rf"^pid {process.pid} on \S+\n$")
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 0)
        with open(os.path.join(run_dir, ".lock")) as f:
            self.assertEqual(f.read(), "", "a finished run leaves no holder's pid behind")

    def test_run_dir_under_proc_cannot_be_created(self):
        # /proc holds no directories of ours (mkdir: ENOENT): a config to fix, exit 2.
        self.assert_config_error('mantissa: run.dir = "/proc/mantissa-run": cannot be created: '
                                 "No such file or directory", "--set", "run.dir=/proc/mantissa-run")

    def test_run_dir_lock_file_that_cannot_be_opened(self):
        # A run.dir this user may not write to refuses the lock file; the tests run as root,
        # whom a read-only mode does not stop, so a directory in the lock file's place stands in.
        run_dir = os.path.join(self.dir, "runs", "c")
        os.makedirs(os.path.join(run_dir, ".lock"))
        self.assert_config_error(
            'mantissa: run.dir = "runs/c": cannot open the run directory\'s lock file '
            "'runs/c/.lock': Is a directory")

    def test_export_over_an_existing_file(self):
        out = self.write("w.safetensors", "a file the user keeps")
        self.assert_config_error(
            f"mantissa: --out {out}: already exists; remove it first, or choose another --out",
            "--out", out, command="export")
        with open(out) as f:
            self.assertEqual(f.read(), "a file the user keeps")
        # A dangling link is something at --out too (a rename would replace the link).
        link = os.path.join(self.dir, "dangling.safetensors")
        os.symlink(os.path.join(self.dir, "nowhere"), link)
        self.assert_config_error(
            f"mantissa: --out {link}: already exists; remove it first, or choose another --out",
            "--out", link, command="export")
        self.assertTrue(os.path.islink(link))
        # --format hf renames its directory into place, which a link there (to an empty
        # directory) would refuse only at the end, after the whole export.
        empty = os.path.join(self.dir, "empty")
        os.mkdir(empty)
        hf_link = os.path.join(self.dir, "hf")
        os.symlink(empty, hf_link)
        for given in (hf_link, hf_link + "/"):  # a shell completes a link to a directory so
            self.assert_config_error(
                f"mantissa: --out {given}: is a symbolic link; give the directory it names, or "
                "another --out", "--format", "hf", "--out", given, config=lu.TINY_GPT,
                command="export")

    def test_export_into_a_missing_directory(self):
        out = os.path.join(self.dir, "missing", "w.safetensors")
        self.assert_config_error(
            f"mantissa: --out {out}: directory '{self.dir}/missing' does not exist",
            "--out", out, command="export")
        self.assert_config_error(
            "mantissa: --out w.st/: names a directory (it ends in '/'); a safetensors file is "
            "written, --format hf writes a directory", "--out", "w.st/", command="export")
        # A file where the directory should be, and a directory that holds no files (procfs:
        # ENOENT though it exists), are refused before the checkpoint is read.
        not_a_dir = self.write("notes.txt", "")
        self.assert_config_error(
            f"mantissa: --out {not_a_dir}/w.st: directory '{not_a_dir}' is not a directory",
            "--out", f"{not_a_dir}/w.st", command="export")
        self.assert_config_error(
            "mantissa: --out '/proc/w.st': cannot create a file in '/proc': No such file or "
            "directory", "--out", "/proc/w.st", command="export")

    def test_export_without_a_checkpoint(self):
        self.assert_config_error(
            'mantissa: run.dir = "runs/c": holds no checkpoint to export (runs/c/checkpoints '
            'does not exist)', "--out", "w.safetensors", command="export")
        # What a run killed during its first save leaves is named as such.
        os.makedirs(os.path.join(self.dir, "runs", "c", "checkpoints", "step_00000002.tmp"))
        self.assert_config_error(
            'mantissa: run.dir = "runs/c": holds no checkpoint to export (runs/c/checkpoints '
            'holds only an unfinished save (step_00000002.tmp), which a run killed while saving '
            'leaves)', "--out", "w.safetensors", command="export")

    def test_export_from_a_run_directory_that_is_not_one(self):
        # As mantissa sample says it: the directory, not the config file inside it.
        for run, why in (("nowhere", "no such directory"),
                         (self.write("afile", ""), "is not a directory (--run takes a run.dir)"),
                         (self.dir, "has no config.pbtxt (not the run.dir of a `mantissa train` "
                                    "run?)")):
            with self.subTest(run=run):
                result = self.mantissa("export", "--run", run, "--out", "w.safetensors")
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stderr, f"mantissa: --run {run}: {why}\n")
        result = self.mantissa("export", "--run", "", "--out", "w.safetensors")
        self.assertEqual((result.returncode, result.stderr), (2, "mantissa: --run needs a run "
                                                                 "directory (see mantissa export "
                                                                 "--help)\n"))

    def test_export_when_the_checkpoints_cannot_be_listed(self):
        # A listing that fails is no empty directory; its kind (a file in the way: 2) holds
        # in export as in train.
        os.makedirs(os.path.join(self.dir, "runs", "c"))
        self.write(os.path.join("runs", "c", "checkpoints"), "")
        self.assert_config_error(
            "mantissa: cannot list the checkpoints in runs/c/checkpoints: Not a directory",
            "--out", "w.safetensors", command="export")

    def test_run_dir_too_long_for_a_checkpoints_files(self):
        # Within a few bytes of PATH_MAX the run directory and a probe file fit, a checkpoint's
        # files would not: refused before the first step, nothing left.
        parents = os.path.join(self.dir, *(["d" * 200] * 19))
        run_dir = os.path.join(parents, "e" * (4049 - len(parents)))  # 4050 bytes
        longest = len(run_dir) + len("/checkpoints/step_00000005.tmp/rank_00000.bin.index")
        self.assertLess(len(run_dir) + len("/checkpoints/.mantissa-probe-XXXXXX"), 4095)
        self.assertGreater(longest, 4095)
        self.assert_config_error(
            f'mantissa: run.dir = "{run_dir}": too long: a checkpoint\'s files would be named by '
            f"paths of {longest} bytes, past the system's limit of 4095",
            "--set", f"run.dir={run_dir}", "--set", "run.steps=5")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "d" * 200)))

    def test_run_dir_that_cannot_be_created(self):
        # The message names the name on the way that is no directory, and what it is.
        self.write("file", "")
        self.assert_config_error(
            f'mantissa: run.dir = "{self.dir}/file/run": cannot be created: '
            f"'{self.dir}/file' is a file, not a directory",
            "--set", f"run.dir={self.dir}/file/run")
        os.symlink(os.path.join(self.dir, "nowhere"), os.path.join(self.dir, "dangling"))
        self.assert_config_error(
            f'mantissa: run.dir = "{self.dir}/dangling": cannot be created: '
            f"'{self.dir}/dangling' is a symbolic link to '{self.dir}/nowhere', which names "
            "nothing", "--set", f"run.dir={self.dir}/dangling")

    def test_metrics_port_in_use(self):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            # Another process holds it (another job on the node): a runtime failure, exit 1,
            # which a later start may not meet.
            path = self.write("c.pbtxt", BASE)
            result = self.mantissa("train", "--config", path, "--set", f"metrics.port={port}")
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertEqual(result.stderr.splitlines()[-1],
                             f"mantissa: error: metrics: cannot listen on 127.0.0.1:{port}: "
                             "Address already in use (metrics.bind_address, metrics.port + "
                             "local rank)")

    def test_bad_command_lines(self):
        path = self.write("c.pbtxt", BASE)
        cases = [
            (["train"], "mantissa: --config FILE.pbtxt is required (see mantissa train --help)"),
            (["train", "--config", path, "--steps", "5"],
             "mantissa: unknown argument '--steps' (see mantissa train --help)"),
            (["train", "--config", path, "--set"],
             "mantissa: --set needs a value (see mantissa train --help)"),
            (["train", "--config", path, "--set", "run.steps"],
             "mantissa: --set run.steps: expected path.to.field=value"),
            (["trian"], "mantissa: unknown command 'trian' (see mantissa --help)"),
            (["export", "--config", path],
             "mantissa: --out FILE.safetensors is required (see mantissa export --help)"),
            (["config", "--config", path, "--progress", "live"],
             "mantissa: unknown argument '--progress' (see mantissa config --help)"),
        ]
        for args, message in cases:
            with self.subTest(args):
                result = self.mantissa(*args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stderr.splitlines(), [message])


class Overrides(lu.TempDirTest):
    def effective(self, *sets, config=BASE):
        path = self.write("c.pbtxt", config)
        args = []
        for s in sets:
            args += ["--set", s]
        result = self.mantissa("config", "--config", path, *args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.stderr = result.stderr
        return result.stdout

    def test_set_reaches_nested_fields_enums_bools_and_repeated_fields(self):
        text = self.effective("model.mlp.hidden=96", "precision.mode=FP16",
                              "precision.loss_scale.growth_interval=7", "dist.overlap=false",
                              "debug.inject_nonfinite_steps=1", "debug.inject_nonfinite_steps=3",
                              "run.dir=out/x")
        self.assertIn("hidden: 96", text)
        self.assertIn("mode: FP16", text)
        self.assertRegex(text, r"loss_scale \{\n    mode: DYNAMIC\n")  # FP16's default
        self.assertIn("growth_interval: 7", text)
        self.assertIn("overlap: false", text)
        self.assertEqual(re.findall(r"inject_nonfinite_steps: (\d+)", text), ["1", "3"])
        self.assertIn('dir: "out/x"', text)

    def test_set_selects_a_oneof_member(self):
        corpus = self.write("corpus.txt", "hello world\n" * 100)
        text = self.effective("model.gpt2={n_layer: 1, n_head: 2, n_embd: 32, seq_len: 16}",
                              f"data.text_file.path={corpus}")
        self.assertNotIn("mlp {", text)
        self.assertRegex(text, r"gpt2 \{\n    n_layer: 1\n    n_head: 2\n    n_embd: 32\n")
        self.assertIn(f'path: "{corpus}"', text)
        self.assertNotIn("synthetic", text)
        # The model was selected as a whole; the data source through one of its fields, which
        # drops the file's synthetic settings: said, so that a mistyped path is noticed.
        self.assertEqual(self.stderr.splitlines(), [
            f"mantissa: note: --set data.text_file.path={corpus} selects data.text_file in place "
            "of data.synthetic, whose settings are dropped"])

    def test_a_message_body_keeps_the_fields_it_does_not_name(self):
        # A body sets what it names, as a field given twice in a file does: the config's other
        # settings of that message stay (they were reset to their defaults).
        config = BASE.replace("model { mlp { n_embd: 32 hidden: 64 seq_len: 16 } }",
                              "model { gpt2 { n_layer: 4 n_head: 4 n_embd: 128 seq_len: 32 } }")
        self.assertNotEqual(config, BASE)
        text = self.effective("model.gpt2={n_layer: 2}", "debug={inject_nonfinite_steps: 1}",
                              "debug={inject_nonfinite_steps: 2}", config=config)
        self.assertRegex(text, r"gpt2 \{\n    n_layer: 2\n    n_head: 4\n    n_embd: 128\n"
                               r"    seq_len: 32\n")
        self.assertEqual(re.findall(r"inject_nonfinite_steps: (\d+)", text), ["1", "2"])
        self.assertEqual(self.stderr, "")

    def test_a_note_that_explains_an_error_comes_with_it(self):
        def refusal(config, *sets):
            """`mantissa config` of `config` with the --set arguments: its one line of stderr."""
            result = self.mantissa("config", "--config", self.write("c.pbtxt", config),
                                   *[arg for value in sets for arg in ("--set", value)])
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
            return result.stderr.rstrip("\n")

        gpt2 = "model { gpt2 { n_layer: 1 n_head: 2 n_embd: 32 seq_len: 16 } }\n"
        llama_note = ("(note: --set model.llama.{} selects model.llama in place of model.gpt2, "
                      "whose settings are dropped)")
        # Setting a field of another data source drops the synthetic one; the file it lacks is
        # the error, and the note, on the same line, says why it lacks one.
        self.assertEqual(
            refusal("data { synthetic {} }", "data.text_file.val_fraction=0.5"),
            'mantissa: data.text_file.path = "": must name a file (note: --set '
            "data.text_file.val_fraction=0.5 selects data.text_file in place of data.synthetic, "
            "whose settings are dropped)")
        # A rule of another field that cites the selected member's value: its defaults explain
        # it; a member switched to twice, its last note, whose defaults the config took.
        eval_tokens = "run { eval_tokens: 64 }\n" + gpt2 + "data { synthetic {} }"
        too_long = ("mantissa: run.eval_tokens = 64: must be >= model.llama.seq_len = 256 (one "
                    "window) ")
        self.assertEqual(refusal(eval_tokens, "model.llama.n_layer=1"),
                         too_long + llama_note.format("n_layer=1"))
        self.assertEqual(refusal(eval_tokens, "model.llama.n_layer=1", "model.gpt2.n_layer=1",
                                 "model.llama.n_head=2"),
                         too_long + llama_note.format("n_head=2"))
        # A rule citing the member's value in a range.
        line = refusal(gpt2 + "data { synthetic { n_tokens: 200 } }", "model.llama.n_layer=1")
        self.assertIn("must lie in [model.llama.seq_len + 1 = 257, ", line)
        self.assertTrue(line.endswith(llama_note.format("n_layer=1")), line)
        # Errors the note does not explain come alone: a rule that lists the member's fields
        # without their values, a path inside a value, a value that does not parse.
        text = self.write("x.txt", "hello world\n" * 100)
        line = refusal("run { eval_every: 10 }\ndata { synthetic { val_tokens: 0 } }",
                       "data.text_file.path=" + text, "data.text_file.val_fraction=0")
        self.assertIn("run.eval_every = 10: needs a validation set", line)
        self.assertNotIn("note:", line)
        for path in ("runs/model.llama.txt", "runs/[model.llama.seq_len + 1].txt",
                     "runs/a model.llama.seq_len = 1.txt"):
            line = refusal(f'data {{ text_file {{ path: "{path}" }} }}', "model.llama.n_layer=1")
            self.assertIn(f'data.text_file.path = "{path}"', line)
            self.assertNotIn("note:", line)
        self.assertEqual(
            refusal("data { synthetic {} }", "data.text_file.path=c.txt",
                    "data.text_file.val_fraction=abc"),
            "mantissa: --set data.text_file.val_fraction=abc: val_fraction takes a number, got "
            "'abc'")

    def test_later_sets_win_and_defaults_fill_the_rest(self):
        text = self.effective("run.steps=5", "run.steps=6")
        self.assertIn("steps: 6", text)
        self.assertIn('dir: "runs/c"', text)  # runs/<config file name>
        self.assertIn("bucket_mb: 25", text)

    def test_shipped_configs_are_valid(self):
        configs = os.path.join(lu.ARGS.source_dir, "configs")
        names = sorted(n for n in os.listdir(configs) if n.endswith(".pbtxt"))
        self.assertIn("demo.pbtxt", names)
        for name in names:
            with self.subTest(name):
                # Their token shards are not here: the synthetic corpus stands in.
                result = self.mantissa("config", "--config", os.path.join(configs, name),
                                       "--set", "data.synthetic={}")
                self.assertEqual(result.returncode, 0, result.stderr)

    def test_effective_config_is_a_fixed_point(self):
        first = self.effective("precision.mode=FP16")
        self.assertEqual(self.effective(config=first), first)


class Help(lu.TempDirTest):
    def test_overview_lists_every_subcommand(self):
        result = self.mantissa("--help")
        self.assertEqual(result.returncode, 0)
        block = result.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0]
        commands = [line.split()[0] for line in block.splitlines()]
        self.assertTrue({"train", "config", "export", "help"} <= set(commands), result.stdout)
        for command in commands:
            with self.subTest(command):
                help_text = self.mantissa(command, "--help")
                self.assertEqual(help_text.returncode, 0)
                self.assertEqual(self.mantissa("help", command).returncode, 0)
                # Read in a terminal of 100 columns: no line wider.
                wide = [line for line in help_text.stdout.splitlines() if len(line) > 100]
                self.assertEqual(wide, [])
        self.assertEqual(self.mantissa("help").stdout, result.stdout)

    def test_help_only_where_an_option_stands(self):
        # Every command reads -h and --help alike: help where an option stands, even beside a
        # bad one; as an option's value (or one of tokenize's --input files) it is that value.
        for args in (("train", "--set", "run.steps=1", "-h"), ("config", "--bogus", "--help"),
                     ("export", "--out", "w.st", "-h"), ("plan", "--gpus", "1", "--help"),
                     ("sample", "--run", "r", "-h"), ("tokenize", "encode", "--force", "-h")):
            with self.subTest(args=args):
                result = self.mantissa(*args)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertTrue(result.stdout.startswith("usage: mantissa "), result.stdout)
        for args, said in ((("train", "--config", "-h"), "config '-h': cannot open"),
                           (("config", "--config", "-h"), "config '-h': cannot open"),
                           (("sample", "--run", "-h"), "--run -h: no such directory"),
                           (("tokenize", "decode", "--tokenizer", "-h", "--input", "x"),
                            "tokenizer '-h': cannot open"),
                           (("tokenize", "encode", "--input", "-h"),
                            "tokenize encode needs --tokenizer FILE")):
            with self.subTest(args=args):
                result = self.mantissa(*args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                self.assertIn(said, result.stderr)

    def test_no_command_is_a_usage_error(self):
        result = self.mantissa()
        self.assertEqual(result.returncode, 2)
        self.assertIn("commands:", result.stderr)

    def test_train_help_tells_options_exit_codes_and_defaults(self):
        result = self.mantissa("train", "--help")
        self.assertEqual(result.returncode, 0)
        text = result.stdout
        for option in ("--config FILE", "--set PATH=VALUE", "--progress MODE", "--help"):
            self.assertIn(option, text)
        codes = re.findall(r"^  (\d)  ", text.split("exit codes:", 1)[1], re.MULTILINE)
        self.assertEqual(codes, ["0", "1", "2", "3", "4"])
        self.assertIn("SIGUSR1", text)
        self.assertIn("log/rank<R>.jsonl", text)
        self.assertIn("  run.steps = 1000\n", text)
        self.assertIn("  precision.loss_scale.growth_factor = 2\n", text)
        environment = text.split("environment (CPU runs):", 1)[1].split("exit codes:", 1)[0]
        for variable in (
            "OMP_NUM_THREADS",
            "MANTISSA_CPU_BF16_GEMM=0",
            "MANTISSA_CPU_AVX512_CONVERT=0",
            "MANTISSA_CPU_AMX=0",
        ):
            self.assertIn(variable, environment)


class Fp8Scaling(lu.TempDirTest):
    def test_non_default_fp8_scaling_trains(self):
        """precision.fp8 reaches the models' FP8 operands (CURRENT recipe, a margin)."""
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path, "--set", "precision.mode=FP8_HYBRID",
                               "--set", "precision.fp8.recipe=CURRENT", "--set",
                               "precision.fp8.margin=1", "--set", f"run.dir={self.dir}/run")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(len(lu.read_log(f"{self.dir}/run", 0)), 4)

    def test_resume_with_another_amax_history_len_keeps_the_newest_amaxes(self):
        """A resume may change precision.fp8.amax_history_len (the histories keep their newest
        entries; core's test checks which), and says so; a loss scale to start from is marked as
        of no use to a resumed run, and several changes are listed one to a line."""
        path = self.write("c.pbtxt", BASE)
        dynamic = ("--set", "precision.mode=FP8_HYBRID", "--set",
                   "precision.loss_scale.mode=DYNAMIC")
        result = self.mantissa("train", "--config", path, *dynamic, "--set",
                               "precision.fp8.amax_history_len=16", "--set", "run.steps=2")
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.mantissa("train", "--config", path, *dynamic, "--set",
                               "precision.fp8.amax_history_len=8", "--set",
                               "precision.loss_scale.init=1024")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(
            "mantissa: settings changed since the checkpoint (checkpoint -> this run):\n"
            "  run.steps 2 -> 4\n"
            "  precision.loss_scale.init 65536 -> 1024 (no effect: the dynamic scale goes on from "
            "the checkpoint's)\n"
            "  precision.fp8.amax_history_len 16 -> 8\n", result.stderr)
        self.assertEqual(len(lu.read_log(os.path.join(self.dir, "runs", "c"), 0)), 4)


class StartLine(lu.TempDirTest):
    def test_cpu_runs_say_which_code_paths_ran(self):
        """The start line names the CPU paths, and the MANTISSA_CPU_* switches change them."""
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path, "--set", f"run.dir={self.dir}/a")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr, r"(?m)^mantissa: CPU paths: BF16/FP8 GEMM .*, FP16 GEMM "
                                        r"AVX2/FMA kernel, FP32 GEMM OpenBLAS sgemm \(\w+ "
                                        r"kernels\), conversions .*$")
        env = lu.environment(MANTISSA_CPU_BF16_GEMM="0", MANTISSA_CPU_AVX512_CONVERT="0",
                             OPENBLAS_CORETYPE="Haswell")
        result = self.mantissa("train", "--config", path, "--set", f"run.dir={self.dir}/b",
                               env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: CPU paths: BF16/FP8 GEMM AVX2/FMA kernel (FP32, widened while "
                      "packing), FP16 GEMM AVX2/FMA kernel, FP32 GEMM OpenBLAS sgemm (Haswell "
                      "kernels), conversions AVX2/F16C, GELU and attention AVX2\n", result.stderr)


class Version(lu.TempDirTest):
    def build_name(self):
        result = self.mantissa("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout.splitlines()[0]

    def test_version_names_the_build_and_the_libraries_it_loaded(self):
        result = self.mantissa("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        name = re.fullmatch(r"mantissa (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}(?:-dirty)?|unknown)\)",
                            lines[0])
        self.assertTrue(name, lines[0])
        with open(os.path.join(lu.ARGS.source_dir, "CMakeLists.txt")) as f:
            self.assertIn(f"project(mantissa VERSION {name.group(1)} ", f.read())
        head = subprocess.run(["git", "-C", lu.ARGS.source_dir, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True)
        expected_commit = head.stdout.strip() if head.returncode == 0 else "unknown"
        self.assertEqual(name.group(2).removesuffix("-dirty"), expected_commit)
        for key in ("build type: ", "CUDA backend: ", "NCCL: ", "MPI: ", "protobuf: ",
                    "CPU paths: "):
            self.assertEqual(len([line for line in lines if line.startswith(key)]), 1,
                             f"one line starting {key!r}:\n{result.stdout}")
        self.assertIn("mantissa --version", self.mantissa("--help").stdout)

    def test_runs_and_checkpoints_name_their_build(self):
        """A run's output names the build, its checkpoints record it, and a resume from a
        checkpoint another build saved says which."""
        name = self.build_name()
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"\n{name}\n", "\n" + result.stderr)
        step_dir = os.path.join(self.dir, "runs", "c", "checkpoints", "step_00000004")
        manifest = lu.decode_manifest(step_dir)
        self.assertIn(f'written_by: "{name}"\n', manifest)

        result = self.mantissa("train", "--config", path, "--set", "run.steps=5")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"checkpoints/step_00000004 (saved by 1 rank)\n", result.stderr)

        older = "mantissa 0.1.0 (commit 0123456789ab)"
        lu.write_manifest(step_dir, manifest.replace(f'written_by: "{name}"', f'written_by: "{older}"'))
        shutil.rmtree(os.path.join(self.dir, "runs", "c", "checkpoints", "step_00000005"))
        result = self.mantissa("train", "--config", path, "--set", "run.steps=5")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"checkpoints/step_00000004 (saved by 1 rank running {older})\n",
                      result.stderr)


class RunOutcomes(lu.TempDirTest):
    def test_weights_the_last_step_breaks_end_as_diverged(self):
        # No later training loss shows what the last update did; the evaluation after it does,
        # and nothing is saved.
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=1", "--set",
                               "optimizer.adamw.lr=1e30")
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertIn("mantissa: training diverged at step 1/1: the validation loss after it is "
                      "not finite (nan)", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "runs", "c", "checkpoints")))

    def test_a_tokenizer_that_is_no_model_is_refused_whatever_the_data(self):
        # Byte-level text trains without it, but sample and export would use it.
        path = self.write("c.pbtxt", BASE)
        passwd = self.write("passwd", "root:x:0:0:root:/root:/bin/bash\n")
        result = self.mantissa("train", "--config", path, "--set", f"data.tokenizer={passwd}")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.splitlines()[-1], f"mantissa: data.tokenizer: tokenizer '{passwd}' is not "
                         "a SentencePiece model (it does not parse as one)")

    def test_a_warmup_longer_than_the_run_trains_with_a_note(self):
        # A short trial of a config written for a longer run (the demo warms up for 20 steps).
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path, "--set", "optimizer.warmup_steps=20")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: note: optimizer.warmup_steps 20 is longer than run.steps 4: the "
                      "learning rate ramps for the whole run and never reaches "
                      "optimizer.adamw.lr\n", result.stderr)
        lrs = [entry["lr"] for entry in lu.read_log(os.path.join(self.dir, "runs", "c"), 0)]
        self.assertEqual(len(lrs), 4)
        peak = float(re.search(r"(?m)^    lr: (\S+)$", self.mantissa(
            "config", "--config", path).stdout).group(1))
        for step, lr in enumerate(lrs):
            self.assertAlmostEqual(lr, peak * (step + 1) / 20, delta=peak * 1e-6)

    def test_export_needs_no_training_data(self):
        # The weights come from the checkpoints; the data may be gone (or on another machine).
        path = self.write("c.pbtxt", BASE)
        self.assertEqual(self.mantissa("train", "--config", path).returncode, 0)
        out = os.path.join(self.dir, "w.safetensors")
        result = self.mantissa("export", "--config", path, "--set",
                               'data.text_file={path: "gone.txt"}', "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(os.path.isfile(out))

    def test_nothing_left_to_train_says_so(self):
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=2")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: nothing to train: the run resumed at step 4 and run.steps is 2; "
                      "raise run.steps to train further\n", result.stderr)
        self.assertNotIn("done,", result.stderr)
        self.assertIn("mantissa: settings changed since the checkpoint: run.steps 4 -> 2\n",
                      result.stderr)
        self.assertEqual(len(lu.read_log(os.path.join(self.dir, "runs", "c"), 0)), 4)
        with open(os.path.join(self.dir, "runs", "c", "config.pbtxt")) as f:
            self.assertIn("  steps: 4\n", f.read(), "the config the steps were trained with")

    def test_resume_on_other_data_says_the_stream_changes(self):
        path = self.write("c.pbtxt", BASE)
        result = self.mantissa("train", "--config", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        text = self.write("corpus.txt", "a second phase of training reads this text. " * 200)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=6", "--set",
                               f"data.text_file.path={text}", "--set", "run.seed=7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: warning: the checkpoint was trained on synthetic tokens, this "
                      f"run reads the text file {text}: the data stream changes from here on\n",
                      result.stderr)
        self.assertIn("mantissa: warning: the checkpoint was trained with run.seed 1, this run "
                      "has 7: the data stream changes from here on\n", result.stderr)
        self.assertEqual(len(lu.read_log(os.path.join(self.dir, "runs", "c"), 0)), 6)
        # Resuming on the same data again: no warning.
        result = self.mantissa("train", "--config", path, "--set", "run.steps=7", "--set",
                               f"data.text_file.path={text}", "--set", "run.seed=7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("warning", result.stderr)
        # The same file moved to another directory: the same tokens, so no warning either.
        moved = os.path.join(self.dir, "moved", "corpus.txt")
        os.makedirs(os.path.dirname(moved))
        os.rename(text, moved)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=8", "--set",
                               f"data.text_file.path={moved}", "--set", "run.seed=7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("warning", result.stderr)
        self.assertIn(f"mantissa: the checkpoint was trained on the text file {text}, this run "
                      f"reads the text file {moved}: the same tokens, so the data stream "
                      "continues\n", result.stderr)
        # Other text at the same path: the path is the same, the stream is not.
        with open(moved, "a") as f:
            f.write("and a few more words at the end. " * 20)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=9", "--set",
                               f"data.text_file.path={moved}", "--set", "run.seed=7")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"mantissa: warning: the checkpoint was trained on other data, this run "
                      f"reads the text file {moved}: the data stream changes from here on\n",
                      result.stderr)

    def test_another_seed_on_synthetic_data_warns_once(self):
        # The synthetic tokens come from the seed: one warning, the seed's, not a second one
        # about other data.
        path = self.write("c.pbtxt", BASE)
        self.assertEqual(self.mantissa("train", "--config", path).returncode, 0)
        result = self.mantissa("train", "--config", path, "--set", "run.steps=5", "--set",
                               "run.seed=2")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.count("warning"), 1, result.stderr)
        self.assertIn("mantissa: warning: the checkpoint was trained with run.seed 1, this run "
                      "has 2: the data stream changes from here on\n", result.stderr)

    def test_a_failure_of_one_rank_alone_ends_without_mpi_abort(self):
        # Every checkpoint damaged: exit 1 with the reason, and no Open MPI abort banner after
        # it (a job of one rank has no peer to stop).
        saved = os.path.join(self.dir, "runs", "c", "checkpoints", "step_00000002")
        os.makedirs(saved)
        self.write(os.path.join(saved, "manifest.pb"), "x")
        result = self.mantissa("train", "--config", self.write("c.pbtxt", BASE))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"(?m)^mantissa: error: checkpoint load: no intact "
                                        r"checkpoint in runs/c/checkpoints: 1 found, each "
                                        r"damaged \(see above\)$")
        self.assertNotIn("MPI_ABORT", result.stderr)

    def test_out_of_memory_says_so(self):
        # 4 GiB of address space, and a micro-batch whose activations need far more.
        def limit_memory():
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        result = subprocess.run(
            [lu.binary(), "train", "--config", self.write("c.pbtxt", BASE), "--set",
             "model.gpt2={n_layer: 1, n_head: 2, n_embd: 32, seq_len: 64}", "--set",
             "data.micro_batch_size=60000"], cwd=self.dir, env=lu.environment(),
            preexec_fn=limit_memory, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 1, result.stderr)
        # Said by the tensor allocator (with the size) or, for any other allocation, by the
        # launcher (with what to change): whichever fails first.
        self.assertRegex(result.stderr, r"(?m)^mantissa: error: (allocate_cpu: out of host memory "
                                        r"allocating [0-9]+ bytes|out of host memory "
                                        r"\(std::bad_alloc\)); lower data\.micro_batch_size, the "
                                        r"model's seq_len or its size")


if __name__ == "__main__":
    lu.main()
