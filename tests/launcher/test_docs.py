"""What the documents say about mantissa's exit codes and the Slurm scripts is what they do.

core/error.h's `enum class ErrorKind` is the source of the exit codes (its values are the
codes; 0 is success). README.md, deploy/README.md and `mantissa train --help` each list every
code with the same number and meaning, so that no table drifts again (deploy/README.md once
said "3 diverged", which is 4). And deploy/slurm's two scripts, run here with stand-ins for
mpirun, srun and scontrol (no Slurm needed), do what deploy/README.md says: they requeue only a
preemption (exit 0 after USR1), end with mantissa's code otherwise, and give each rank
OMP_NUM_THREADS = --cpus-per-task (else the node's CPUs / its ranks, at least 1).
"""

import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import unittest

import launcher_util as lu

# The words every document uses for each code, by ErrorKind name; 0 (success) is no kind.
SUCCESS_WORDS = "done"
KIND_WORDS = {
    "kFailure": "runtime failure",
    "kConfig": "config",
    "kPeerLost": "peer rank",
    "kDiverged": "diverged",
}


def source(path):
    with open(os.path.join(lu.ARGS.source_dir, path)) as f:
        return f.read()


def interrupted_code():
    """launcher/exit_codes.h's exit code after SIGINT, which is no ErrorKind."""
    match = re.search(r"kExitInterrupted\s*=\s*(\d+);", source("launcher/exit_codes.h"))
    if match is None:
        raise AssertionError("launcher/exit_codes.h has no `kExitInterrupted = N;`")
    return int(match.group(1))


def error_kinds():
    """{name: code} of core/error.h's ErrorKind."""
    enum = re.search(r"enum class ErrorKind\s*\{(.*?)\};", source("core/error.h"), re.S)
    if enum is None:
        raise AssertionError("core/error.h has no `enum class ErrorKind { ... };`")
    values = re.findall(r"^\s*(k\w+)\s*=\s*(\d+)\s*,", enum.group(1), re.M)
    kinds = {name: int(code) for name, code in values}
    if not kinds:
        raise AssertionError("core/error.h's ErrorKind lists no `kName = code,` values")
    return kinds


def flat(text):
    return " ".join(text.split())


def help_codes():
    """{code: meaning} from `mantissa train --help`: lines "  N  meaning" (and their indented
    continuation lines) after "exit codes:", up to the blank line."""
    result = subprocess.run([lu.binary(), "train", "--help"], capture_output=True, text=True,
                            timeout=30)
    if result.returncode != 0 or "exit codes:\n" not in result.stdout:
        raise AssertionError(f"`mantissa train --help` (exit {result.returncode}) has no "
                             f"'exit codes:' section:\n{result.stdout}{result.stderr}")
    section = result.stdout.split("exit codes:\n", 1)[1].split("\n\n", 1)[0]
    return {int(code): flat(text)
            for code, text in re.findall(r"^  (\d+)  (.*(?:\n {5,}.*)*)", section, re.M)}


def readme_codes():
    """{code: meaning} from README.md's "Exit codes: 0 done, 1 ..., 4 ...." sentence."""
    match = re.search(r"Exit codes: (.*?)\.(?:\s|$)", flat(source("README.md")))
    if match is None:
        raise AssertionError("README.md has no 'Exit codes: 0 ..., 1 ....' sentence")
    return {int(code): text.strip() for code, text in re.findall(r"(\d+) ([^,]+)", match.group(1))}


def deploy_readme_codes():
    """{code: meaning} from deploy/README.md's table "| code | meaning | the scripts |"."""
    text = source("deploy/README.md")
    table = re.search(r"^\| code \| meaning \| the scripts \|\n\|[-|]+\|\n((?:\|.*\n?)*)", text,
                      re.M)
    if table is None:
        raise AssertionError("deploy/README.md has no '| code | meaning | the scripts |' table")
    return {int(code): meaning.strip()
            for code, meaning in re.findall(r"^\| (\d+) \| ([^|]+) \|", table.group(1), re.M)}


class ExitCodeTables(unittest.TestCase):
    def setUp(self):
        self.kinds = error_kinds()
        unknown = set(self.kinds) - set(KIND_WORDS)
        self.assertFalse(unknown, f"core/error.h's ErrorKind has {sorted(unknown)}, which this "
                         "test does not know: add the words the documents use for them to "
                         "KIND_WORDS")
        self.expected = {0: (SUCCESS_WORDS, "success"),
                         interrupted_code(): ("interrupted", "kExitInterrupted")}
        for name, code in self.kinds.items():
            self.assertNotIn(code, self.expected, f"ErrorKind::{name} reuses exit code {code}")
            self.expected[code] = (KIND_WORDS[name], f"ErrorKind::{name}")

    def check(self, document, codes):
        self.assertEqual(sorted(codes), sorted(self.expected),
                         f"{document} lists exit codes {sorted(codes)}; core/error.h has "
                         f"{sorted(self.expected)}")
        for code, (words, kind) in self.expected.items():
            self.assertIn(words, codes[code].lower(),
                          f"{document} says exit code {code} is '{codes[code]}', but {code} is "
                          f"{kind} (core/error.h): expected it to mention '{words}'")

    def test_help(self):
        self.check("`mantissa train --help`", help_codes())

    def test_readme(self):
        self.check("README.md", readme_codes())

    def test_deploy_readme(self):
        self.check("deploy/README.md", deploy_readme_codes())


# Stand-ins put first on PATH: the launcher records how it was called and the OMP_NUM_THREADS
# it was given, then exits with $STUB_EXIT, at once or (STUB_WAIT=1) when USR1 reaches it, as
# mantissa's ranks do; scontrol records its arguments.
LAUNCHER_STUB = """#!/bin/bash
printf '%s\\n' "$*" >"$STUB_DIR/launcher.args"
printf '%s\\n' "$OMP_NUM_THREADS" >"$STUB_DIR/launcher.omp"
printf '%s\\n' "${SLURM_PMIX_FENCE-unset}" >"$STUB_DIR/launcher.fence"
trap 'exit "$STUB_EXIT"' USR1
# A rank's first line, after its handlers are set; deploy/mantissa-mpirun holds USR1 back until
# one comes (or, where Open MPI's output_filename is set, 5 s have passed: STUB_QUIET).
[ -n "${STUB_QUIET:-}" ] || echo "mantissa: stand-in started" >&2
touch "$STUB_DIR/launcher.started"
if [ "$STUB_WAIT" = 1 ]; then
  while :; do sleep 0.05; done
fi
exit "$STUB_EXIT"
"""
SCONTROL_STUB = """#!/bin/bash
printf '%s\\n' "$*" >>"$STUB_DIR/scontrol.calls"
"""

SCRIPTS = [("mantissa-1node.sbatch", None), ("mantissa-multinode.sbatch", "srun"),
           ("mantissa-multinode.sbatch", "mpirun")]


class SlurmScripts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mantissa_docs_")
        for name, text in (("mpirun", LAUNCHER_STUB), ("srun", LAUNCHER_STUB),
                           ("scontrol", SCONTROL_STUB)):
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, stat.S_IRWXU)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def stub_file(self, name):
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()

    def run_script(self, script, launcher, exit_code, preempt=False, **slurm):
        """Runs the sbatch script as Slurm would (its SLURM_* variables); returns its exit
        code. With preempt, USR1 goes to the script once the launcher has started."""
        for name in ("launcher.args", "launcher.omp", "launcher.fence", "launcher.started",
                     "scontrol.calls"):
            if os.path.exists(os.path.join(self.dir, name)):
                os.remove(os.path.join(self.dir, name))
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("SLURM_", "OMP_", "MANTISSA_"))}
        env.update(PATH=f"{self.dir}:{os.environ['PATH']}", STUB_DIR=self.dir,
                   STUB_EXIT=str(exit_code), STUB_WAIT="1" if preempt else "0",
                   MANTISSA_CONFIG="c.pbtxt", MANTISSA_METRICS_PORT="0",
                   MANTISSA_RUN_DIR=os.path.join(self.dir, "run"), SLURM_JOB_ID="42",
                   SLURM_JOB_NAME="mantissa", SLURM_NTASKS="2", SLURM_JOB_NUM_NODES="1",
                   SLURM_JOB_NODELIST="node1", OMP_NUM_THREADS="64")
        if launcher:
            env["MANTISSA_LAUNCHER"] = launcher
        if launcher == "mpirun":
            # mpirun through deploy/mantissa-mpirun, which runs the stand-in and passes USR1 on.
            env["MANTISSA_MPIRUN"] = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        env.update(slurm)
        process = subprocess.Popen(
            ["bash", os.path.join(lu.ARGS.source_dir, "deploy", "slurm", script)], env=env,
            cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if preempt:
            deadline = time.time() + 30
            while self.stub_file("launcher.started") is None:
                if process.poll() is not None or time.time() > deadline:
                    process.kill()
                    self.fail(f"{script}: the launcher did not start:\n{process.communicate()[0]}")
                time.sleep(0.02)
            process.send_signal(signal.SIGUSR1)
        output = process.communicate(timeout=60)[0]
        self.output = output
        return process.returncode

    def test_only_a_preemption_is_requeued(self):
        codes = [0] + sorted(error_kinds().values())
        for script, launcher in SCRIPTS:
            for code in codes:
                for preempt in (False, True):
                    with self.subTest(script=script, launcher=launcher, code=code, preempt=preempt):
                        status = self.run_script(script, launcher, code, preempt,
                                                 SLURM_CPUS_PER_TASK="1")
                        self.assertEqual(status, code, f"the script must end with mantissa's "
                                         f"code {code}; it ended with {status}:\n{self.output}")
                        calls = self.stub_file("scontrol.calls")
                        if preempt and code == 0:
                            self.assertEqual(calls, "requeue 42\n", self.output)
                        else:
                            self.assertIsNone(calls, f"exit {code}, preempted={preempt}: only a "
                                              f"preemption may be requeued:\n{self.output}")

    def test_ranks_stopped_short_of_run_steps_are_requeued(self):
        # A USR1 that reached the ranks without passing through the script (`scancel
        # --signal=USR1` signals the job's steps): exit 0 short of run.steps, which the run
        # directory tells. A stop during the first start leaves no checkpoint at all.
        # The script reads the run directory back from `mantissa config`: the real binary.
        config = os.path.join(self.dir, "tiny.pbtxt")
        with open(config, "w") as f:
            f.write(lu.TINY_GPT)
        run = os.path.join(self.dir, "run")
        os.makedirs(os.path.join(run, "checkpoints"))
        with open(os.path.join(run, "config.pbtxt"), "w") as f:
            f.write("run {\n  steps: 100\n}\n")
        latest = os.path.join(run, "checkpoints", "latest")
        for launcher in ("srun", "mpirun"):
            for newest, requeued in ((None, True), ("step_00000050", True),
                                     ("step_00000100", False)):
                with self.subTest(launcher=launcher, newest=newest):
                    if newest:
                        with open(latest, "w") as f:
                            f.write(newest + "\n")
                    elif os.path.exists(latest):
                        os.remove(latest)
                    status = self.run_script("mantissa-multinode.sbatch", launcher, 0,
                                             MANTISSA=lu.binary(), MANTISSA_CONFIG=config)
                    self.assertEqual(status, 0, self.output)
                    self.assertEqual(self.stub_file("scontrol.calls"),
                                     "requeue 42\n" if requeued else None, self.output)

    def test_mantissa_mpirun_has_its_own_help(self):
        # Before it looks for mpirun: the help of a wrapper whose mpirun is missing still shows.
        wrapper = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        for flag in ("-h", "--help"):
            result = subprocess.run([wrapper, flag], capture_output=True, text=True,
                                    env={**os.environ, "MPIRUN": "/nonexistent/mpirun"})
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertTrue(result.stdout.startswith("usage: mantissa-mpirun"), result.stdout)
            self.assertIn("MANTISSA_ABORT_GRACE_S", result.stdout)

    def test_mantissa_mpirun_passes_mpiruns_output_through_unchanged(self):
        # Every byte of mpirun's stderr, as it came (as bash's read did, less NUL bytes): tabs,
        # backslashes, bytes that are not UTF-8, an empty line, spaces at either end; a NUL
        # ends no line; the last line lacks its newline, which the filter adds. A 100,000-line
        # stream comes through whole.
        wrapper = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        odd = (b"a\\tb\t\\n \x01\xff\xfe caf\xc3\xa9\n\nx\x00y\n\x00\n   lead  \n"
               b"no newline at the end")
        many = b"".join(b"step %d/100000 | loss 3.14 | 12.3k tok/s\n" % i for i in range(100000))
        stand_in = os.path.join(self.dir, "cat-mpirun")
        with open(stand_in, "w") as f:
            f.write('#!/bin/sh\nexec cat "$1" >&2\n')
        os.chmod(stand_in, 0o755)
        for name, data, expected in (("odd", odd, odd.replace(b"\x00", b"") + b"\n"),
                                     ("many", many, many)):
            with self.subTest(name):
                path = os.path.join(self.dir, name)
                with open(path, "wb") as f:
                    f.write(data)
                result = subprocess.run([wrapper, path], capture_output=True, timeout=60,
                                        env={**os.environ, "MPIRUN": stand_in})
                self.assertEqual(result.returncode, 0, result.stderr[-2000:])
                self.assertEqual(result.stderr, expected)

    def test_mantissa_mpirun_writes_each_line_whole(self):
        # stdout and stderr into one file (Slurm's slurm-%j.out, 2>&1): a line of the filter's is
        # one write, so the job's stdout, written meanwhile, never lands inside it.
        wrapper = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        stand_in = os.path.join(self.dir, "two-streams-mpirun")
        with open(stand_in, "w") as f:
            f.write("#!/bin/bash\n"
                    "for i in $(seq 20000); do echo OUT-line-of-the-job-stdout; done &\n"
                    "for i in $(seq 20000); do echo ERR-line-of-the-job-stderr; done >&2\n"
                    "wait\n")
        os.chmod(stand_in, 0o755)
        both = os.path.join(self.dir, "both.out")
        with open(both, "wb") as out:
            result = subprocess.run([wrapper], stdout=out, stderr=subprocess.STDOUT,
                                    timeout=120, env={**os.environ, "MPIRUN": stand_in})
        self.assertEqual(result.returncode, 0)
        with open(both) as f:
            lines = f.read().splitlines()
        self.assertEqual(sorted(set(lines)), ["ERR-line-of-the-job-stderr",
                                              "OUT-line-of-the-job-stdout"])
        self.assertEqual(len(lines), 40000)

    def run_wrapper_over_hung_mpirun(self, banner, grace):
        # mantissa-mpirun over an mpirun that prints `banner` (its lines) on stderr, then hangs
        # as on a lost host; returns the result and the seconds it took.
        wrapper = os.path.join(lu.ARGS.source_dir, "deploy", "mantissa-mpirun")
        hung, printed = (os.path.join(self.dir, name) for name in ("hung-mpirun", "banner"))
        with open(printed, "wb") as f:
            f.write(b"".join(line.encode() + b"\n" for line in banner))
        with open(hung, "w") as f:
            f.write(f"#!/bin/sh\ncat '{printed}' >&2\nexec sleep 60\n")
        os.chmod(hung, 0o755)
        started = time.monotonic()
        result = subprocess.run([wrapper, "-np", "2", "true"], capture_output=True, text=True,
                                timeout=50, env={**os.environ, "MPIRUN": hung,
                                                 "MANTISSA_ABORT_GRACE_S": grace})
        return result, time.monotonic() - started

    def test_mantissa_mpirun_reads_its_grace_in_decimal(self):
        # An mpirun that reports an MPI_Abort and then hangs (as on a lost host) is ended
        # MANTISSA_ABORT_GRACE_S seconds later. "08" is 8 s (bash's arithmetic read it as a bad
        # octal number, and the wrapper then never ended mpirun); a number beyond 9 digits (one
        # past 2^63 wrapped to a negative grace) is refused.
        banner = ("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
                  "with errorcode 3.")
        result, seconds = self.run_wrapper_over_hung_mpirun(banner, "08")
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("mantissa-mpirun: mpirun did not end within 8 s of the job's MPI_Abort "
                      "(errorcode 3)", result.stderr)
        self.assertNotIn("value too great for base", result.stderr)
        self.assertLess(seconds, 40)
        # A line with a NUL byte just before the banner hides it from no one (mawk -W
        # interactive, which the filter runs on Debian, joined the next line to such a line).
        result, _ = self.run_wrapper_over_hung_mpirun(("binary \0 garbage",) + banner, "1")
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("mpirun did not end within 1 s of the job's MPI_Abort", result.stderr)
        result, _ = self.run_wrapper_over_hung_mpirun(banner, "18446744073709551615")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("MANTISSA_ABORT_GRACE_S must be a whole number of seconds (at most 9 "
                      "digits), not '18446744073709551615'", result.stderr)

    def test_mantissa_mpirun_ends_mpirun_hung_after_a_ranks_nonzero_exit(self):
        # A rank whose MPI start or end outlasted MANTISSA_MPI_START_TIMEOUT_S exits 3 without
        # MPI_Abort; Open MPI reports the non-zero exit, then waits for the lost host's daemon.
        # The grace is at least 10 s there: a healthy mpirun takes a second or two to end and
        # pass on the rank's own exit code.
        result, seconds = self.run_wrapper_over_hung_mpirun(
            ("Primary job  terminated normally, but 1 process returned",
             "a non-zero exit code. Per user-direction, the job has been aborted."), "1")
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("mantissa-mpirun: mpirun did not end within 10 s of a rank's non-zero "
                      "exit; a host it waits for is probably unreachable.", result.stderr)
        self.assertGreaterEqual(seconds, 10)
        self.assertLess(seconds, 40)

    def test_a_preemption_reaches_ranks_whose_output_mpirun_keeps(self):
        # Open MPI's output_filename set in the environment (as mpirun --output-filename): no
        # rank line passes the wrapper, which sends USR1 once mpirun has run 5 s.
        script, launcher = "mantissa-multinode.sbatch", "mpirun"
        status = self.run_script(script, launcher, 0, True, SLURM_CPUS_PER_TASK="1",
                                 STUB_QUIET="1",
                                 OMPI_MCA_orte_output_filename=os.path.join(self.dir, "out"))
        self.assertEqual(status, 0, self.output)
        self.assertEqual(self.stub_file("scontrol.calls"), "requeue 42\n", self.output)

    def test_srun_holds_every_rank_in_mpi_init_until_all_are_there(self):
        # Slurm's PMIx plugin ran MPI_Init's closing barrier over a tree that let ranks through
        # early (deploy/README.md): the multi-node script's srun asks for the ring, unless the
        # environment names a fence; mpirun does not use Slurm's PMIx plugin.
        for launcher, given, expected in (("srun", None, "ring"), ("srun", "tree", "tree"),
                                          ("mpirun", None, "unset")):
            with self.subTest(launcher=launcher, given=given):
                slurm = {"SLURM_PMIX_FENCE": given} if given else {}
                status = self.run_script("mantissa-multinode.sbatch", launcher, 0, **slurm)
                self.assertEqual(status, 0, self.output)
                self.assertEqual(self.stub_file("launcher.fence"), expected + "\n", self.output)

    def test_threads_per_rank(self):
        # (SLURM_* settings, OMP_NUM_THREADS every rank must get)
        cases = [({"SLURM_CPUS_PER_TASK": "3", "SLURM_CPUS_ON_NODE": "6"}, "3"),
                 ({"SLURM_CPUS_ON_NODE": "5"}, "2"),
                 ({"SLURM_CPUS_ON_NODE": "1"}, "1")]
        for script, launcher in SCRIPTS:
            for slurm, threads in cases:
                with self.subTest(script=script, launcher=launcher, slurm=slurm):
                    self.assertEqual(self.run_script(script, launcher, 0, **slurm), 0, self.output)
                    self.assertEqual(self.stub_file("launcher.omp"), threads + "\n", self.output)
                    args = self.stub_file("launcher.args")
                    if launcher == "srun":
                        # srun no longer reads SLURM_CPUS_PER_TASK (Slurm 22.05): passed again.
                        cpus = slurm.get("SLURM_CPUS_PER_TASK")
                        if cpus:
                            self.assertIn(f" --cpus-per-task={cpus} ", args)
                        else:
                            self.assertNotIn("--cpus-per-task", args)
                    else:
                        self.assertIn(" -x OMP_NUM_THREADS ", args, "mpirun must pass it on")


if __name__ == "__main__":
    lu.main()
