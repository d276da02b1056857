"""Shared pieces of the launcher tests (python3 standard library only): they run the real
build/bin/mantissa, alone or under mpirun, in a temporary directory.
"""

import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None  # --source-dir / --build-dir, parsed by main()

# A config that trains in a few seconds on one CPU core per rank: a tiny GPT on the synthetic
# corpus. Tests add --set overrides.
TINY_GPT = """
run { steps: 60 seed: 3 device: CPU log_every: 10 }
model { gpt2 { n_layer: 2 n_head: 2 n_embd: 64 seq_len: 64 } }
data { synthetic { n_tokens: 262144 } micro_batch_size: 4 }
optimizer { adamw { lr: 0.003 weight_decay: 0 } warmup_steps: 6 min_lr_ratio: 0.1 }
precision { mode: BF16 }
checkpoint { every_steps: 20 }
"""

# Keys every line of log/rank<R>.jsonl carries (ARCHITECTURE.md's contract, plus ours).
REQUIRED_KEYS = {"step", "loss", "loss_scale", "overflow", "grad_norm", "lr", "tokens_per_s",
                 "step_seconds", "mean_loss", "tokens", "allreduce_seconds", "allreduce_bytes",
                 "host_syncs", "time", "epoch"}


def binary():
    return os.path.join(ARGS.build_dir, "bin", "mantissa")


def environment(**extra):
    env = dict(os.environ)
    # One OpenMP thread per rank: the ranks share the machine's cores.
    env.update(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra)
    return env


def mpirun_prefix(ranks):
    return ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]


class TempDirTest(unittest.TestCase):
    """Each test gets its own directory, removed afterwards."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mantissa_launcher_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def mantissa(self, *args, ranks=0, timeout=120, env=None):
        """Runs mantissa (under mpirun when ranks > 0); returns the CompletedProcess."""
        command = (mpirun_prefix(ranks) if ranks else []) + [binary(), *args]
        return subprocess.run(command, cwd=self.dir, env=env or environment(), timeout=timeout,
                              capture_output=True, text=True)

    def start(self, *args, ranks=0):
        """Starts mantissa in the background; returns the Popen. With SIGINT's default action
        whatever this runner was started with: mantissa keeps a signal ignored, and the tests
        send it Ctrl-C."""
        command = (mpirun_prefix(ranks) if ranks else []) + [binary(), *args]
        return subprocess.Popen(command, cwd=self.dir, env=environment(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def read_log(run_dir, rank):
    with open(os.path.join(run_dir, "log", f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def count_lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def wait_for_lines(path, count, process, timeout=120):
    """Waits until `path` has `count` lines; fails if the process ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if count_lines(path) >= count:
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before {path} had "
                                 f"{count} lines")
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {count} lines in {timeout} s")


def rank_pids(mpirun_pid):
    """{rank: pid} of the processes mpirun started (its children, identified by their
    OMPI_COMM_WORLD_RANK), found through /proc, never by name."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError, IndexError):
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
    return pids


def checkpoint_buffer_numel(step_dir):
    """Elements of each flat buffer (masters, adam_m, adam_v) of a checkpoint, as its
    manifest's tensor index records them (decoded by protoc, which the build uses)."""
    text = decode_manifest(step_dir)
    tensors = text[text.index("\ntensors {"):]
    return int(re.search(r"shape: (\d+)", tensors).group(1))


def decode_manifest(step_dir):
    """A checkpoint's manifest as protobuf text (protoc, which the build uses)."""
    with open(os.path.join(step_dir, "manifest.pb"), "rb") as f:
        return subprocess.run(["protoc", "--proto_path=" + os.path.join(ARGS.source_dir, "proto"),
                               "--decode=mantissa.TrainState", "checkpoint.proto"],
                              stdin=f, capture_output=True, check=True).stdout.decode()


def crc32c(data):
    """CRC32C (Castagnoli, reflected 0x82F63B78), bit by bit: an independent reference."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def write_manifest(step_dir, text):
    """Replaces a checkpoint's manifest with protobuf text `text` (its manifest_crc32c line
    ignored), sealed as checkpoint.proto describes: the message, then field 15 (tag 0x7D) with
    the CRC32C of the bytes before it."""
    text = "\n".join(line for line in text.splitlines()
                     if not line.startswith("manifest_crc32c:"))
    body = subprocess.run(["protoc", "--proto_path=" + os.path.join(ARGS.source_dir, "proto"),
                           "--encode=mantissa.TrainState", "checkpoint.proto"],
                          input=text.encode(), capture_output=True, check=True).stdout
    with open(os.path.join(step_dir, "manifest.pb"), "wb") as f:
        f.write(body + b"\x7d" + struct.pack("<I", crc32c(body)))


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    # The tests run mantissa in temporary directories.
    ARGS.source_dir = os.path.abspath(ARGS.source_dir)
    ARGS.build_dir = os.path.abspath(ARGS.build_dir)
    if not os.access(binary(), os.X_OK):
        print(f"FAIL: {binary()} is missing: build the `mantissa` target first", flush=True)
        sys.exit(1)
    unittest.main(argv=[sys.argv[0], "-v", *rest])
