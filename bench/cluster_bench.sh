# shellcheck shell=bash
# Shared by the benchmarks that run on the test cluster of scripts/start-cluster.sh (hosts in
# network namespaces, links shaped with tbf): bench/bench_slow_link.sh, bench/bench_scaling.sh.
# Sourced, not run. The calling script sets `build` (the build tree) and calls, in order:
#
#   cluster_bench_enter "$@"     as root, reruns the script in a private network namespace
#                                (mpirun listens on every interface of its namespace) and exits
#                                with its status; returns inside it
#   cluster_bench_start N        hosts node1..N (1 slot each), stopped when the script exits;
#                                the binary is staged where the hosts see it
#   cluster_bench_shape RATE     every host's link limited to RATE (tc tbf, both directions)
#   cluster_bench_train LABEL HOSTS [--set ...]
#                                `mantissa train` of the reference GPT on the first HOSTS hosts,
#                                1 rank each; prints one line of figures for LABEL and leaves
#                                them in $figures_step_s, $figures_comm_s, $figures_tokens_s
#
# The reference configuration is bench_dist_train's and bench/torch_gpt.py's: a GPT-2 of 10.84M
# parameters (vocabulary 256, 256 positions, width 384, 6 layers of 6 heads), 8 sequences of
# 256 tokens per step over all ranks, BF16 compute, 1 thread per rank. Figures are medians over
# the steps after the first (allocations, page faults): step time, the communication that
# backward did not hide (allreduce_seconds: the gradient sync's wait after backward), and
# tokens/s of the whole job.

cluster_bench_enter() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$(basename "$0"): needs root (the hosts are network namespaces)" >&2
    exit 1
  fi
  if [ "${MANTISSA_BENCH_NETNS:-}" != 1 ]; then
    # The script from the source tree's root, where the caller has changed to.
    MANTISSA_BENCH_NETNS=1 exec unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh \
      bash "bench/$(basename "$0")" "$@"
  fi
}

cluster_bench_start() {
  local hosts=$1
  bench_dir=$(mktemp -d /var/tmp/mantissa-bench.XXXXXX)
  export CLUSTER_DIR=$bench_dir/cluster
  trap 'scripts/stop-cluster.sh; rm -rf "$bench_dir"' EXIT
  SLOTS=1 scripts/start-cluster.sh "$hosts" >"$bench_dir/mpi.env" || exit 1
  # shellcheck disable=SC1091 # the cluster's Open MPI settings, written just now
  source "$bench_dir/mpi.env"
  # The hosts see the file system but /tmp: the binary and runs live in bench_dir.
  # shellcheck disable=SC2154 # set by the calling script
  cp "$build/bin/mantissa" "$bench_dir/mantissa"
  echo "# benchmark: every setting comes from --set" >"$bench_dir/train.pbtxt"
  bench_hosts=$hosts
}

cluster_bench_shape() {
  local k
  for k in $(seq "$bench_hosts"); do
    scripts/cluster-link.sh rate "node$k" "$1"
  done
}

cluster_bench_train() {
  local label=$1 hosts=$2
  shift 2
  local run=$bench_dir/run-$RANDOM$RANDOM
  # shellcheck disable=SC2207 # cluster_bench_model's words are separate arguments
  local sets=(--set run.device=CPU --set run.log_every=1 --set run.eval_every=0
    --set checkpoint.every_steps=0 --set "run.dir=$run" --set "run.steps=${bench_steps:-6}"
    $(cluster_bench_model "$hosts") "$@")
  head -n "$hosts" "$CLUSTER_DIR/hostfile" >"$bench_dir/hostfile-$hosts"
  # The hosts' shells start from an empty environment (as ssh logins do): the CPU path switches
  # go with the ranks explicitly, or the paths bench_cpu_paths printed would not be theirs.
  if ! mpirun --allow-run-as-root --hostfile "$bench_dir/hostfile-$hosts" -np "$hosts" \
    --bind-to none -x OMP_NUM_THREADS=1 -x MANTISSA_MPI_PROGRESS_THREAD \
    -x MANTISSA_CPU_BF16_GEMM -x MANTISSA_CPU_AVX512_CONVERT -x MANTISSA_CPU_AMX \
    "$bench_dir/mantissa" train --config "$bench_dir/train.pbtxt" "${sets[@]}" \
    >"$run.out" 2>&1; then
    echo "$label: mantissa train failed:" >&2
    tail -n 20 "$run.out" >&2
    exit 1
  fi
  # tokens_per_s in the log is the rank's; the job's is the ranks' sum.
  read -r figures_step_s figures_comm_s figures_tokens_s < <(python3 - "$run/log/rank0.jsonl" "$hosts" <<'EOF'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()][1:]
step = statistics.median(s["step_seconds"] for s in steps)
comm = statistics.median(s["allreduce_seconds"] for s in steps)
tokens = statistics.median(s["tokens_per_s"] for s in steps) * int(sys.argv[2])
print(f"{step:.3f} {comm:.3f} {tokens:.0f}")
EOF
  )
  printf '%-44s %8s %12s %10s\n' "$label" "$figures_step_s" "$figures_comm_s" "$figures_tokens_s"
  rm -rf "$run" "$run.out"
}

# The reference model and this many hosts' share of its batch, as --set arguments (for
# `mantissa train` and `mantissa plan` alike; no value holds a space).
cluster_bench_model() {
  echo --set model.gpt2.n_layer=6 --set model.gpt2.n_head=6 --set model.gpt2.n_embd=384 \
    --set model.gpt2.seq_len=256 --set model.gpt2.vocab_size=256 \
    --set "data.micro_batch_size=$((8 / $1))" --set precision.mode=BF16
}

cluster_bench_header() {
  printf '%-44s %8s %12s %10s\n' "run" "step s" "exposed s" "tokens/s"
}

# awk for ratios: in every Debian installation, bc is not.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
