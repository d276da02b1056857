"""The test cluster of hosts in network namespaces, for the multinode tests (python3 stdlib).

scripts/start-cluster.sh starts hosts node1..nodeN (each its own network, hostname and /tmp,
on a bridge in 198.18.0.0/24); scripts/stop-cluster.sh removes them. Cluster (a context
manager) starts one with its state in a directory of the test, always stops it, and fails the
test if anything of it is left. mpirun_argv() is mpirun as on a real cluster: a hostfile, the
remote shell scripts/cluster-rsh-agent, every daemon and rank on the cluster's subnet, TCP
between ranks.

The whole test runs in a private network namespace (isolate_network): the bridge, and the
sockets mpirun opens on all interfaces, then exist only there, unreachable from the machine's
real network.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402 (the integration tests' helpers: deadline, logs, train argv)

SUBNET = "198.18.0.0/24"
# What every rank logs per step that must match bit for bit between runs that reduce in the
# same order (floats as logged: shortest round-trip decimal, so equal text is equal bits).
EXACT_FIELDS = ("loss", "mean_loss", "loss_scale", "overflow", "grad_norm", "lr", "tokens")


def skip(reason):
    """Ends the test as skipped; ctest matches "SKIPPED (multinode)" (SKIP_REGULAR_EXPRESSION)."""
    print(f"SKIPPED (multinode): {reason}", flush=True)
    sys.exit(0)


def running_hosts():
    """The cluster hosts (network namespaces named nodeK) that exist now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith("node")]


def require_namespaces():
    """Skips unless this is root and network namespaces can be made here; fails if a cluster
    (namespaces named nodeK) is already running, since the test starts and stops its own."""
    if os.geteuid() != 0:
        skip("the cluster of network namespaces needs root")
    missing = [t for t in ("ip", "nsenter", "unshare", "tc") if shutil.which(t) is None]
    if missing:
        skip(f"{', '.join(missing)} not installed (iproute2, util-linux)")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        skip(f"`ip netns` is unavailable: {probe.stderr.strip()}")
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        skip("network namespaces cannot be created here (unshare --net failed)")
    running = running_hosts()
    if running:
        harness.fail(f"a cluster ({', '.join(running)}) is already running; the test starts "
                     "its own: stop it first (scripts/stop-cluster.sh)")


def _raise_on_sigterm(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


def isolate_network(source_dir):
    """Reruns this test in a private network namespace with only loopback up, and exits with its
    status; returns when already inside. A SIGTERM (ctest's timeout, someone stopping the test)
    becomes an exception in both, so that their finally blocks stop the cluster; if the rerun
    dies without stopping it, it is stopped here (its hosts' namespaces outlive the private
    one)."""
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    if os.environ.get("MANTISSA_TEST_NETNS") == "1":
        return
    env = dict(os.environ, MANTISSA_TEST_NETNS="1")
    rerun = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"',
                              "sh", sys.executable, *sys.argv], env=env)
    try:
        rc = rerun.wait()
    finally:
        if rerun.poll() is None:
            rerun.terminate()
            try:
                rerun.wait(timeout=harness.DEADLINE_MARGIN_S / 2)
            except subprocess.TimeoutExpired:
                rerun.kill()
                rerun.wait()
        if running_hosts():
            harness.log("the test left its cluster running: stopping it")
            subprocess.run([os.path.join(source_dir, "scripts", "stop-cluster.sh")])
    sys.exit(rc)


class Cluster:
    """`with Cluster(source_dir, state_dir, hosts):` a cluster of `hosts` hosts, stopped at the
    end whatever happens; a stop that leaves anything behind fails the test."""

    def __init__(self, source_dir, state_dir, hosts, slots=2):
        self.scripts = os.path.join(source_dir, "scripts")
        self.hosts = hosts
        self.env = dict(os.environ, CLUSTER_DIR=state_dir, SLOTS=str(slots))
        self.state_dir = state_dir

    def __enter__(self):
        harness.log(f"starting a cluster of {self.hosts} hosts")
        try:
            start = subprocess.run([os.path.join(self.scripts, "start-cluster.sh"), str(self.hosts)],
                                   env=self.env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.stop()
            harness.fail("start-cluster.sh did not finish within 60 s")
        if start.returncode != 0:
            self.stop()
            harness.fail(f"start-cluster.sh {self.hosts} failed:\n{start.stderr}")
        harness.log(start.stderr.strip())
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        stop = subprocess.run([os.path.join(self.scripts, "stop-cluster.sh")], env=self.env,
                              capture_output=True, text=True, timeout=60)
        leftovers = running_hosts()
        if stop.returncode != 0 or leftovers:
            harness.fail(f"stop-cluster.sh left the cluster behind (namespaces {leftovers}):\n"
                         f"{stop.stderr}")
        harness.log("cluster stopped, nothing left")

    @property
    def hostfile(self):
        return os.path.join(self.state_dir, "hostfile")

    def link(self, action, host, *args):
        """scripts/cluster-link.sh ACTION HOST [ARGS]: cut (down), restore (up), shape (rate) or
        unshape a host's link; a failure fails the test."""
        run = subprocess.run([os.path.join(self.scripts, "cluster-link.sh"), action, host, *args],
                             env=self.env, capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            harness.fail(f"cluster-link.sh {action} {host} {' '.join(args)} failed:\n{run.stderr}")

    def processes(self, host):
        """{pid: command name} of every process in the host's network namespace but its keeper."""
        out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout
        with open(os.path.join(self.state_dir, f"{host}.pid")) as f:
            keeper = int(f.read())
        found = {}
        for pid in (int(p) for p in out.split()):
            if pid == keeper:
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    found[pid] = f.read().strip()
            except OSError:
                pass  # it ended meanwhile
        return found

    def write_hostfile(self, name, lines):
        """A hostfile in the cluster's directory, `lines` like "node1 slots=2"; returns its path."""
        path = os.path.join(self.state_dir, name)
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        return path

    def mpirun_argv(self, np, hostfile=None, env=()):
        """mpirun for np ranks over the hosts of hostfile (default: every host, 2 slots each),
        with each `NAME=VALUE` of env set on every rank (-x). Run it with the environment
        self.env: the remote shell finds the hosts through its CLUSTER_DIR."""
        argv = ["mpirun", "--allow-run-as-root", "--hostfile", hostfile or self.hostfile,
                "-np", str(np), "--bind-to", "none",
                "--mca", "plm_rsh_agent", os.path.join(self.state_dir, "cluster-rsh-agent"),
                "--mca", "oob_tcp_if_include", SUBNET, "--mca", "btl_tcp_if_include", SUBNET,
                "--mca", "pml", "ob1", "--mca", "btl", "self,tcp"]
        for e in env:
            argv += ["-x", e]
        return argv


@contextlib.contextmanager
def slurm(nodes):
    """`with slurm(nodes) as slurm_dir:` Slurm across the cluster's hosts (scripts/start-slurm.sh
    --hosts N: slurmctld on the machine, one slurmd inside each host), its state in the
    cluster's directory, stopped at the end whatever happens."""
    slurm_dir = os.path.join(nodes.state_dir, "slurm")
    try:
        started = subprocess.run(
            [os.path.join(nodes.scripts, "start-slurm.sh"), "--hosts", str(nodes.hosts), slurm_dir],
            env=nodes.env, capture_output=True, text=True, timeout=90)
        if started.returncode != 0:
            harness.fail(f"start-slurm.sh --hosts {nodes.hosts} failed:\n{started.stderr}")
        harness.log(f"Slurm up: slurmctld on the machine, a slurmd on each of {nodes.hosts} hosts")
        yield slurm_dir
    finally:
        subprocess.run([os.path.join(nodes.scripts, "stop-slurm.sh"), slurm_dir],
                       env=dict(nodes.env, KEEP="0"), timeout=120)


def slurm_job_env(nodes, slurm_dir, **settings):
    """What sbatch passes to a job on the cluster: Open MPI's settings of the cluster (TCP on its
    subnet), Slurm's config, root allowed, and `settings`; no OMP_NUM_THREADS (the scripts set
    it) and no SLURM_PMIX_FENCE (the multi-node script chooses it)."""
    env = {k: v for k, v in nodes.env.items() if k not in ("OMP_NUM_THREADS", "SLURM_PMIX_FENCE")}
    with open(os.path.join(nodes.state_dir, "mpi.env")) as f:
        for line in f.read().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
    env.update(SLURM_CONF=os.path.join(slurm_dir, "slurm.conf"), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **settings)
    return env


@contextlib.contextmanager
def work_directory(args, prefix):
    """`with work_directory(args, prefix) as (workdir, config, binary):` a test's directory,
    outside /tmp (every host has a /tmp of its own, the rest of the file system is shared),
    holding an empty config and a copy of the mantissa binary for the hosts to run (a build tree
    in /tmp, as a CI clone may be, is out of their sight). Removed when the body succeeds, unless
    --keep; otherwise kept, and named."""
    os.makedirs("/var/tmp", exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
    ok = False
    try:
        config = harness.write_empty_config(workdir)
        binary = os.path.join(workdir, "mantissa")
        shutil.copy2(harness.mantissa_binary(args.build_dir), binary)
        yield workdir, config, binary
        ok = True
    finally:
        if ok and not args.keep:
            subprocess.run(["rm", "-rf", workdir])
        else:
            harness.log(f"files kept in {workdir}")


def processes_mentioning(text):
    """{pid: command line} of every process on the machine whose command line contains text
    (the test's work directory: what the test started and what its hosts run from it)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if text in cmdline:
            found[int(entry)] = cmdline
    return found


def exact_steps(run_dir, rank):
    """{step: (EXACT_FIELDS)} of a rank's log; {} before it exists. A line cut short by a lost
    process is skipped; a step redone after a resume keeps its last line."""
    entries = {}
    path = os.path.join(run_dir, "log", f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            entries[e["step"]] = tuple(e[k] for k in EXACT_FIELDS)
    return entries


def cut_node2_until_rank0_exits(nodes, run_dir, bound, label=""):
    """Cuts node2's link in the middle of a run whose rank 0 is on node1 (logging the step rank
    0 had reached, after `label`) and waits, at most `bound` seconds, until no mantissa process
    is left on node1. Returns the time.monotonic() of the cut and the seconds rank 0 took to
    exit after it."""
    nodes.link("down", "node2")
    cut = time.monotonic()
    harness.log(f"{label}node2's link cut at step {max(exact_steps(run_dir, 0))}")
    harness.wait_until(f"rank 0 on node1 to exit (bound {bound:.0f} s)",
                       lambda: "mantissa" not in nodes.processes("node1").values(),
                       timeout=bound, interval=0.2)
    return cut, time.monotonic() - cut


def tail(path, lines=40):
    """The last lines of a file, for failure messages."""
    with open(path) as f:
        return "".join(f.readlines()[-lines:])
