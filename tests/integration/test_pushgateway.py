#!/usr/bin/env python3
"""A real Pushgateway receives what mantissa pushes.

1. The exporter alone: test_metrics' push test runs against the gateway (values, and the
   group of job + rank replaced as a whole by each push).
2. A 2-rank `mpirun` run of mantissa with metrics.pushgateway_url and no pull exporter
   (metrics.port=0): after it exits, the gateway holds one group per rank whose step counter
   equals the steps run, pushed every metrics.push_every steps and once more at exit; another
   job's groups are its own; the run resumed on 1 rank deletes rank 1's group.
"""

import os
import re
import subprocess

import harness


def pushed_samples(url):
    """The gateway's /metrics as a list of (name, labels dict, value)."""
    samples = []
    for line in harness.http_get(f"{url}/metrics").splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def main():
    args = harness.parse_args()
    harness.require_tools("prometheus-pushgateway", "mpirun")
    test_metrics = os.path.join(args.build_dir, "bin", "test_metrics")
    harness.isolate_network()

    with harness.Workdir("mantissa-pushgateway-", args.keep) as workdir:
        daemons = harness.Daemons(workdir)
        try:
            url = harness.start_pushgateway(daemons)
            port = url.rsplit(":", 1)[1]

            harness.log("exporter push test against the real gateway")
            env = dict(os.environ, MANTISSA_TEST_PUSHGATEWAY_PORT=port)
            result = subprocess.run(
                [test_metrics, "--gtest_filter=Metrics.PushReplacesTheGroupOfJobAndRank"],
                env=env, capture_output=True, text=True, timeout=60)
            print(result.stdout[-3000:], result.stderr[-2000:])
            if result.returncode != 0 or "[  PASSED  ] 1 test" not in result.stdout:
                harness.fail("test_metrics' push test failed against the gateway")

            binary = harness.mantissa_binary(args.build_dir)
            steps, push_every = 12, 5
            run_dir = os.path.join(workdir, "run")
            settings = harness.SMALL_RUN_SETTINGS + [
                f"run.steps={steps}", f"run.dir={run_dir}", "checkpoint.every_steps=0",
                "metrics.port=0", f"metrics.pushgateway_url={url}",
                f"metrics.push_every={push_every}"]
            argv = harness.mpirun_prefix(2) + harness.train_argv(
                binary, harness.write_empty_config(workdir), settings)
            harness.log("run: " + " ".join(argv))
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=min(90, harness.time_left()))
            print(result.stdout[-3000:], result.stderr[-3000:])
            if result.returncode != 0:
                harness.fail(f"mantissa exited with {result.returncode}")

            samples = pushed_samples(url)
            for rank in ("0", "1"):
                found = [(labels, value) for name, labels, value in samples
                         if name == "mantissa_steps_total" and labels.get("rank") == rank
                         and labels.get("job") != "mantissa_push_test"]
                if len(found) != 1:
                    harness.fail(f"rank {rank}: expected one pushed mantissa_steps_total, "
                                 f"got {found}")
                labels, value = found[0]
                if value != steps:
                    harness.fail(f"rank {rank}: pushed mantissa_steps_total {value}, "
                                 f"expected {steps} (the final push at exit)")
                harness.log(f"rank {rank}: group {labels} holds mantissa_steps_total {value}")
                for name in ("mantissa_loss_scale", "mantissa_loss", "mantissa_tokens_total",
                             "mantissa_step_seconds_count"):
                    if not any(n == name and l.get("rank") == rank and
                               l.get("job") == labels["job"] for n, l, _ in samples):
                        harness.fail(f"rank {rank}: {name} was not pushed")
                # The run ended by itself: the alerts take its kept values for no stall.
                finished = [v for n, l, v in samples if n == "mantissa_run_finished" and
                            l.get("rank") == rank and l.get("job") == labels["job"]]
                if finished != [1.0]:
                    harness.fail(f"rank {rank}: pushed mantissa_run_finished {finished}, "
                                 "expected [1.0] after the run's end")
            # A second job pushing to the same gateway under a metrics.job of its own keeps
            # groups of its own: the first job's are still there, unchanged.
            other_steps = 7
            other = [x for x in settings if not x.startswith(("run.steps=", "run.dir="))] + [
                f"run.steps={other_steps}", f"run.dir={run_dir}-other", "metrics.job=other_job"]
            argv = harness.mpirun_prefix(2) + harness.train_argv(
                binary, harness.write_empty_config(workdir), other)
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=min(90, harness.time_left()))
            if result.returncode != 0:
                print(result.stderr[-3000:])
                harness.fail(f"mantissa (metrics.job=other_job) exited with {result.returncode}")
            steps_by_group = {(l.get("job"), l.get("rank")): v for n, l, v in pushed_samples(url)
                              if n == "mantissa_steps_total"}
            for rank in ("0", "1"):
                if steps_by_group.get(("other_job", rank)) != other_steps:
                    harness.fail(f"job other_job rank {rank}: pushed steps "
                                 f"{steps_by_group.get(('other_job', rank))}, expected {other_steps}")
                if steps_by_group.get(("mantissa", rank)) != steps:
                    harness.fail(f"job mantissa rank {rank} after other_job pushed: "
                                 f"{steps_by_group.get(('mantissa', rank))}, expected {steps}")
            harness.log(f"groups by (job, rank): {sorted(steps_by_group.items())}")

            # The first job resumed on 1 rank: rank 0 deletes rank 1's group, whose last values
            # the gateway would keep for ever (a stall alert with no end).
            resumed = [x for x in settings if not x.startswith("run.steps=")] + [
                f"run.steps={steps + 2}"]
            argv = harness.train_argv(binary, harness.write_empty_config(workdir), resumed)
            result = subprocess.run(argv, capture_output=True, text=True,
                                    timeout=min(90, harness.time_left()))
            if result.returncode != 0:
                print(result.stderr[-3000:])
                harness.fail(f"mantissa resumed on 1 rank exited with {result.returncode}")
            groups = {(l.get("job"), l.get("rank")) for n, l, v in pushed_samples(url)
                      if n == "mantissa_steps_total"}
            if ("mantissa", "1") in groups or ("mantissa", "0") not in groups:
                harness.fail(f"after a resume on 1 rank the gateway holds the groups {groups}, "
                             "expected job mantissa's rank 0 only")
            if ("other_job", "1") not in groups:
                harness.fail(f"the resume deleted another job's group: {groups}")
            print("PASS: the Pushgateway holds both ranks' metrics, a group per job and rank, "
                  "and a resume on fewer ranks deletes the groups of the ranks it dropped")
        finally:
            daemons.stop_all()


if __name__ == "__main__":
    main()
