#!/usr/bin/env python3
"""A real Prometheus scrapes a real 2-rank run, and the Grafana dashboard's queries work.

A Prometheus server (127.0.0.1, free port, data in a temporary directory, the project's alert
rules loaded) scrapes both ranks of `mpirun -np 2 mantissa train` every second. Rank 1 gets
non-finite gradients injected at two steps; once Prometheus has seen both, the run is stopped
with SIGUSR1. Then every query of every
panel of deploy/grafana/mantissa.json, with the dashboard variables substituted as Grafana
would, is evaluated over the run's time range through the HTTP API and must return finite
data; the overflow panel must show the injected overflows, on both ranks (the skip decision is
shared); every series must carry a rank label.
"""

import json
import math
import os
import re
import signal
import subprocess
import time

import harness

SCRAPE_SECONDS = 1
# What Grafana puts in $__rate_interval at a 1 s scrape interval: max(interval + scrape,
# 4 × scrape), rounded up a little so that every window holds several samples.
RATE_INTERVAL = "5s"
# The run is not timed by its step count (a fixed count had been 11-39 s on 2 cores while each
# rank ran 2 threads, 3 s once they took 1 each): it trains until Prometheus has scraped both
# ranks' overflow counters at their final value SCRAPES_AFTER times, then is stopped with
# SIGUSR1. The overflows come late enough that Prometheus has scraped the counters at 0 first
# (increase() needs a sample from before the overflow; the test checks it did), against a first
# scrape within 1-2 s: at step 1000, or later where a short run of the same job shows steps
# faster than 8 ms (about 9 ms on a 2-core EPYC, 3 ms on a 2-core Sapphire Rapids, whose
# AMX tiles passed step 1000 before the first scrape).
MODEL_SETTINGS = ["model.gpt2.n_embd=64", "model.gpt2.seq_len=64", "data.micro_batch_size=4"]
FIRST_OVERFLOW_SECONDS = 8
SCRAPES_AFTER = 4
MAX_STEPS = 1_000_000  # a bound only: the test stops the run


def dashboard_queries(path, job, rank):
    """(panel title, expr) for every target of every panel, variables substituted."""
    with open(path) as f:
        dashboard = json.load(f)
    inputs = [i["name"] for i in dashboard.get("__inputs", [])]
    if inputs != ["DS_PROMETHEUS"]:
        harness.fail(f"dashboard __inputs should be [DS_PROMETHEUS], is {inputs}")
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    if variables != ["job", "rank"]:
        harness.fail(f"dashboard variables should be job, rank; are {variables}")

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    substitutions = {"job": job, "rank": rank, "__rate_interval": RATE_INTERVAL,
                     "__interval": f"{SCRAPE_SECONDS}s"}

    def substitute(expr):
        expr = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: substitutions[m.group(1) or m.group(2)], expr)
        return expr

    queries = []
    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            queries.append((p["title"], substitute(t["expr"])))
    return queries


def query_range(url, expr, start, end):
    body = harness.http_json(f"{url}/api/v1/query_range", {
        "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1s"})
    if body.get("status") != "success":
        harness.fail(f"query {expr!r} failed: {body}")
    return body["data"]["result"]


def finite_values(result):
    return [float(v) for series in result for _, v in series["values"]
            if math.isfinite(float(v))]


def injected_steps(binary, workdir, settings):
    """The two steps to inject overflows at: at least 1000 and 1500, and at least
    FIRST_OVERFLOW_SECONDS and 1.5x that into the run at the speed of 200 steps of the same job."""
    run_dir = os.path.join(workdir, "speed")
    argv = harness.mpirun_prefix(2) + harness.train_argv(
        binary, harness.write_empty_config(workdir),
        settings + ["run.steps=200", f"run.dir={run_dir}", "checkpoint.every_steps=0"])
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        harness.fail(f"the speed run failed ({result.returncode}):\n{result.stderr[-2000:]}")
    seconds = sorted(e["step_seconds"] for e in harness.read_step_log(run_dir, 0).values())
    median = seconds[len(seconds) // 2]
    first = max(1000, int(round(FIRST_OVERFLOW_SECONDS / median, -2)))
    harness.log(f"steps of {median * 1e3:.1f} ms: overflows injected at {first} and "
                f"{first * 3 // 2}")
    return [first, first * 3 // 2]


def main():
    args = harness.parse_args()
    harness.require_tools("prometheus", "mpirun")
    binary = harness.mantissa_binary(args.build_dir)
    harness.isolate_network()
    deploy = os.path.join(args.source_dir, "deploy")

    with harness.Workdir("mantissa-prometheus-", args.keep) as workdir:
        daemons = harness.Daemons(workdir)
        try:
            base_port = harness.free_port_block(2)
            targets = [f"127.0.0.1:{base_port}", f"127.0.0.1:{base_port + 1}"]
            url = harness.start_prometheus(
                daemons, workdir, targets, scrape_interval=f"{SCRAPE_SECONDS}s",
                rule_files=[os.path.join(deploy, "prometheus", "alerts.yml")])

            run_dir = os.path.join(workdir, "run")
            job = harness.SMALL_RUN_SETTINGS + MODEL_SETTINGS + ["precision.mode=FP8_HYBRID"]
            injected = injected_steps(binary, workdir, job)
            settings = job + [
                f"run.steps={MAX_STEPS}", f"run.dir={run_dir}", "checkpoint.every_steps=500",
                "metrics.bind_address=127.0.0.1", f"metrics.port={base_port}",
                "metrics.peak_tflops=0.1",
                "debug.inject_nonfinite_rank=1",
            ] + [f"debug.inject_nonfinite_steps={s}" for s in injected]
            argv = harness.mpirun_prefix(2) + harness.train_argv(
                binary, harness.write_empty_config(workdir), settings)
            harness.log("run: " + " ".join(argv))
            start = time.time()
            run = daemons.start("mantissa", argv)
            # Until Prometheus has scraped every injected overflow on both ranks, and then
            # SCRAPES_AFTER more times; bounded.
            limit = min(120, harness.time_left())
            done_since = None
            while True:
                daemons.check_alive("mantissa", run)
                if time.time() - start > limit:
                    harness.fail(f"Prometheus did not see {len(injected)} overflows on "
                                 f"both ranks within {limit:.0f} s:\n" +
                                 daemons.log_tail("mantissa"))
                counters = harness.http_json(f"{url}/api/v1/query",
                                             {"query": "mantissa_overflow_steps_total"})
                seen = {c["metric"].get("rank"): float(c["value"][1])
                        for c in counters["data"]["result"]}
                if seen == {"0": len(injected), "1": len(injected)}:
                    done_since = done_since or time.time()
                    if time.time() - done_since > SCRAPES_AFTER * SCRAPE_SECONDS:
                        break
                time.sleep(SCRAPE_SECONDS / 4)
            run.send_signal(signal.SIGUSR1)  # mpirun forwards it: a checkpoint, then exit 0
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                harness.fail("the run did not stop within 60 s of SIGUSR1:\n" +
                             daemons.log_tail("mantissa"))
            end = time.time()
            print(daemons.log_tail("mantissa", 15))
            if run.returncode != 0:
                harness.fail(f"mantissa exited with {run.returncode}")
            harness.log(f"run took {end - start:.1f}s")

            # The counters were scraped before the first overflow, at 0.
            first = query_range(url, "mantissa_steps_total", start, end)
            if sorted(s["metric"].get("rank") for s in first) != ["0", "1"]:
                harness.fail(f"mantissa_steps_total: series of ranks "
                             f"{sorted(s['metric'].get('rank') for s in first)}, expected 0 and 1")
            for series in first:
                steps = float(series["values"][0][1])
                if steps >= injected[0]:
                    harness.fail(f"rank {series['metric'].get('rank')} was first scraped at "
                                 f"step {steps:.0f}, after the overflow at step "
                                 f"{injected[0]}: increase() cannot see it; inject later")

            up = query_range(url, 'up{job="mantissa"}', start, end)
            scraped = {s["metric"]["instance"] for s in up
                       if any(v == "1" for _, v in s["values"])}
            if scraped != set(targets):
                harness.fail(f"Prometheus scraped {scraped}, expected both ranks {targets}")

            # The variables' own queries, as Grafana runs them.
            jobs = harness.http_json(f"{url}/api/v1/label/job/values",
                                     {"match[]": "mantissa_steps_total"})["data"]
            ranks = harness.http_json(f"{url}/api/v1/label/rank/values",
                                      {"match[]": 'mantissa_steps_total{job=~"mantissa"}',
                                       "start": f"{start:.3f}", "end": f"{end:.3f}"})["data"]
            if "mantissa" not in jobs or sorted(ranks) != ["0", "1"]:
                harness.fail(f"variable queries: job values {jobs}, rank values {ranks}")

            # Every panel query, with "All" ranks (Grafana's allValue .*) and with one rank.
            dashboard = os.path.join(deploy, "grafana", "mantissa.json")
            empty = []
            for rank in (".*", "1"):
                for title, expr in dashboard_queries(dashboard, "mantissa", rank):
                    values = finite_values(query_range(url, expr, start - 5, end + 5))
                    harness.log(f"[rank={rank}] {title}: {len(values)} finite points  {expr}")
                    if not values:
                        empty.append(f"{title} (rank={rank}): {expr}")
            if empty:
                harness.fail("panel queries without data:\n  " + "\n  ".join(empty))

            # The overflow panel shows the injected overflows on both ranks: the decision to
            # skip is taken by all ranks together.
            overflow_exprs = [e for t, e in dashboard_queries(dashboard, "mantissa", ".*")
                              if t == "Overflow steps per rank"]
            result = query_range(url, overflow_exprs[0], start - 5, end + 5)
            per_rank = {s["metric"]["rank"]: max(finite_values([s]), default=0)
                        for s in result}
            harness.log(f"overflow panel peaks per rank: {per_rank}")
            if set(per_rank) != {"0", "1"} or min(per_rank.values()) <= 0:
                harness.fail(f"the injected overflow does not show on every rank: {per_rank}")
            totals = query_range(url, "max_over_time(mantissa_overflow_steps_total[10m])",
                                 end, end + 5)
            counted = {s["metric"]["rank"]: max(finite_values([s])) for s in totals}
            if set(counted) != {"0", "1"} or any(v != len(injected)
                                                 for v in counted.values()):
                harness.fail(f"overflow counters {counted}, expected {len(injected)} "
                             "on each rank")

            unlabelled = query_range(url, '{__name__=~"mantissa_.*", rank=""}', start, end)
            if unlabelled:
                names = sorted({s["metric"]["__name__"] for s in unlabelled})
                harness.fail(f"series without a rank label: {names}")

            rules = harness.http_json(f"{url}/api/v1/rules")["data"]["groups"]
            loaded = [r for g in rules for r in g["rules"]]
            bad = [r["name"] for r in loaded if r.get("health") not in ("ok", "unknown")]
            if len(loaded) < 5 or bad:
                harness.fail(f"alert rules: {len(loaded)} loaded, unhealthy: {bad}")
            print("PASS: every dashboard query returns data; the injected overflow shows")
        finally:
            daemons.stop_all()


if __name__ == "__main__":
    main()
