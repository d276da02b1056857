"""Shared pieces of the integration tests (python3 standard library only).

Every daemon a test starts goes through Daemons.start(): it listens on 127.0.0.1, its PID is
recorded, and Daemons.stop_all() (called from a finally block and on SIGTERM) stops exactly
those PIDs, never anything found by name. Every wait is bounded, and all of them together end
before ctest's TIMEOUT for the test (--timeout): a test that runs out of time fails through its
own finally blocks, which stop its daemons, instead of being killed with them still running.

Where the kernel allows it, isolate_network() reruns a test inside a private network namespace:
then not even the listening sockets that cannot be bound to loopback (mpirun's, Slurm's) can be
reached from outside the test.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request


def skip(reason):
    """Ends the test as skipped; ctest matches the "SKIPPED (integration)" line (SKIP_REGULAR_EXPRESSION)."""
    print(f"SKIPPED (integration): {reason}", flush=True)
    sys.exit(0)


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def require_tools(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        skip(f"{', '.join(missing)} not installed (scripts/install-integration-deps.sh)")


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--timeout", type=float, default=600,
                        help="ctest's TIMEOUT for this test, in seconds")
    args = parser.parse_args()
    # The deadline survives the rerun in a network namespace (isolate_network) unchanged.
    global _deadline
    _deadline = float(os.environ.setdefault(
        "MANTISSA_TEST_DEADLINE", str(time.time() + args.timeout - DEADLINE_MARGIN_S)))
    # Absolute, because the daemons' config files refer to them from another directory.
    args.source_dir = os.path.abspath(args.source_dir)
    args.build_dir = os.path.abspath(args.build_dir)
    return args


# Seconds kept back from ctest's TIMEOUT for stopping daemons and reporting.
DEADLINE_MARGIN_S = 30
_deadline = float("inf")


def time_left():
    return _deadline - time.time()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(count):
    """A base port such that base .. base+count-1 were all free (one per local rank), below the
    kernel's ephemeral range: a port from that range may be taken a moment later by any
    connection or by a listener that asked for any port, also in the hosts' network namespaces,
    where Slurm's and Open MPI's daemons run and this process cannot see their ports (a rank's
    exporter once found its port taken there)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    for _ in range(50):
        base = random.randrange(10000, ephemeral_low - count)
        sockets = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    fail(f"no block of {count} free ports found")


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def http_json(url, params=None, timeout=10):
    if params:
        url += "?" + urllib.parse.urlencode(params)
    return json.loads(http_get(url, timeout))


def wait_until(what, predicate, timeout, interval=0.5):
    """Polls predicate() until it returns a true value (returned) or timeout seconds pass (or
    the test's time is up)."""
    timeout = min(timeout, max(time_left(), 0))
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
            last_error = e
        time.sleep(interval)
    fail(f"timed out after {timeout}s waiting for {what}" +
         (f" (last error: {last_error})" if last_error else ""))


# Inside the namespace: loopback up, plus a veth pair whose both ends stay inside, with a
# private address. Slurm needs the latter: it looks up its listening address with
# AI_ADDRCONFIG, which finds nothing on a host whose only interface is loopback.
NETNS_SETUP = ("ip link set lo up && ip link add mantissa0 type veth peer name mantissa1 && "
               "ip addr add 10.213.0.1/32 dev mantissa0 && ip link set mantissa0 up && "
               "ip link set mantissa1 up")


def isolate_network():
    """Reruns this test in a private network namespace (`unshare --net`) and exits with its
    status; returns at once when already inside one, and when namespaces are not available
    here (then the daemons bound to 127.0.0.1 are still loopback-only)."""
    if os.environ.get("MANTISSA_TEST_NETNS") == "1":
        return
    if shutil.which("unshare") is None or shutil.which("ip") is None or subprocess.run(
            ["unshare", "--net", "--", "sh", "-c", NETNS_SETUP],
            capture_output=True).returncode != 0:
        log("no private network namespace here: running in the host's network")
        return
    env = dict(os.environ, MANTISSA_TEST_NETNS="1")
    sys.exit(subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", NETNS_SETUP + ' && exec "$@"', "sh",
         sys.executable, *sys.argv], env=env).returncode)


class Daemons:
    """Processes this test started, stopped by PID in reverse order."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []  # (name, Popen)
        # A SIGTERM (someone stopping the test) becomes an exception, so that the finally
        # blocks still stop the daemons.
        signal.signal(signal.SIGTERM, self._on_sigterm)

    @staticmethod
    def _on_sigterm(signum, frame):
        raise SystemExit(f"terminated by signal {signum}")

    def start(self, name, argv, env=None):
        out = open(os.path.join(self.workdir, f"{name}.log"), "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        out.close()
        self.procs.append((name, proc))
        log(f"started {name} (pid {proc.pid})")
        return proc

    def check_alive(self, name, proc):
        if proc.poll() is not None:
            fail(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name, lines=40):
        path = os.path.join(self.workdir, f"{name}.log")
        try:
            with open(path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop_all(self):
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log(f"stopped {name} (pid {proc.pid})")
        self.procs.clear()


class Workdir:
    """A temporary directory, removed at the end unless --keep or the test failed (then its
    path is printed: the daemons' logs are in it)."""

    def __init__(self, prefix, keep):
        self.path = tempfile.mkdtemp(prefix=prefix)
        self.keep = keep

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        if self.keep or exc[0] is not None:
            log(f"files kept in {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def start_prometheus(daemons, workdir, scrape_targets, scrape_interval="1s", rule_files=()):
    """A Prometheus server on 127.0.0.1:<free port> with its data in workdir; returns its URL."""
    port = free_port()
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: {scrape_interval}
  evaluation_interval: {scrape_interval}
rule_files: {json.dumps(list(rule_files))}
scrape_configs:
  - job_name: mantissa
    scrape_interval: {scrape_interval}
    static_configs:
      - targets: {json.dumps(scrape_targets)}
""")
    proc = daemons.start("prometheus", [
        "prometheus", f"--config.file={config}",
        f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ])
    url = f"http://127.0.0.1:{port}"
    wait_ready(daemons, "prometheus", proc, url)
    return url


def wait_ready(daemons, name, proc, url, timeout=30):
    """Waits for a Prometheus-style /-/ready endpoint, failing at once if the daemon died."""

    def ready():
        daemons.check_alive(name, proc)
        return http_get(f"{url}/-/ready", timeout=2)

    wait_until(f"{name} to be ready", ready, timeout)


def start_pushgateway(daemons):
    """A Pushgateway on 127.0.0.1:<free port>, nothing persisted; returns its URL."""
    port = free_port()
    proc = daemons.start("pushgateway", [
        "prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}",
        "--persistence.file=", "--log.level=warn"])
    url = f"http://127.0.0.1:{port}"
    wait_ready(daemons, "pushgateway", proc, url)
    return url


def prom_query(url, expr, at=None):
    """Instant query through the HTTP API; returns the result vector."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    body = http_json(f"{url}/api/v1/query", params)
    if body.get("status") != "success":
        fail(f"query {expr!r} failed: {body}")
    return body["data"]["result"]


def mantissa_binary(build_dir):
    path = os.path.join(build_dir, "bin", "mantissa")
    if not os.access(path, os.X_OK):
        fail(f"{path} is not built")
    return path


def mpirun_prefix(np):
    """mpirun for np ranks on this machine: allowed as root, more ranks than cores allowed."""
    return ["mpirun", "-np", str(np), "--oversubscribe", "--allow-run-as-root",
            "--bind-to", "none", "--mca", "btl_tcp_if_include", "lo"]


# A model and batch small enough for a 2-rank CPU run of a few seconds.
SMALL_RUN_SETTINGS = [
    "run.device=CPU", "run.log_every=10", "run.seed=7",
    "model.gpt2.n_layer=2", "model.gpt2.n_head=2", "model.gpt2.n_embd=32",
    "model.gpt2.seq_len=32", "model.gpt2.vocab_size=256",
    "data.micro_batch_size=2", "data.grad_accum_steps=1",
    "optimizer.adamw.lr=0.001", "optimizer.warmup_steps=2",
    "precision.mode=BF16", "precision.loss_scale.mode=DYNAMIC",
    "precision.loss_scale.init=65536", "precision.loss_scale.growth_interval=20",
]


def train_argv(binary, config_path, settings):
    argv = [binary, "train", "--config", config_path]
    for s in settings:
        argv += ["--set", s]
    return argv


def write_empty_config(workdir):
    """An empty TrainConfig: every value the tests need comes through --set."""
    path = os.path.join(workdir, "train.pbtxt")
    with open(path, "w") as f:
        f.write("# integration test: settings come from --set\n")
    return path


def read_step_log(run_dir, rank):
    """log/rank<R>.jsonl as {step: entry} (one line per step: a resume moves the lines of the
    steps it redoes to rank<R>.rolled_back.jsonl)."""
    entries = {}
    with open(os.path.join(run_dir, "log", f"rank{rank}.jsonl")) as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                entries[entry["step"]] = entry
    return entries
