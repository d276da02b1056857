#!/usr/bin/env bash
# Scaling across hosts, on the test cluster (scripts/start-cluster.sh): the reference GPT of
# bench/cluster_bench.sh (10.84M parameters, 8 x 256 tokens per step over all ranks: strong
# scaling, BF16 compute) on 1, 2 and 4 hosts, 1 rank of 1 thread each, every host's link
# limited to RATE (default 1gbit) by tc tbf; with FP32, BF16 and FP8 (E4M3) gradient reduction.
# Prints, per run, the median step time, the communication per step that backward did not hide
# (allreduce_seconds), tokens/s of the job and the scaling efficiency (tokens/s over N times
# the 1-host tokens/s); next to them the anchor, PyTorch DDP over gloo (FP32, bench/torch_gpt.py,
# the same model and optimizer) on the same hosts and links.
#
# Next to each measured step time, `mantissa plan`'s projection of it, calibrated on this
# cluster: one rank's peak is the FP32 FMA peak of one thread measured now (build/bin/fma_peak),
# and the efficiency of N ranks is fitted on the same N-host job (BF16 reduce) before the links
# are shaped, from its step time less the communication it left exposed. The unshaped veth
# links run at memory speed, so that job pays everything the shaped one does (the cores shared
# by the ranks, the synchronisation of every step, the communication's CPU time) except the
# wire. What the projection adds for the shaped links, the bucketed all-reduce at RATE and how
# much of it backward hides, is the model's alone; the last column is its error.
#
# The hosts share this machine's cores: with more hosts than cores the ranks take turns on
# them, which caps the efficiency of every run alike (2 cores, 4 hosts: at most 0.5). Figures
# only; timings on a shared machine are noisy: compare the figures of one run. As root.
#   bench/bench_scaling.sh [build dir] [RATE] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cluster_bench.sh
cluster_bench_enter "$@"
build=${1:-build}
rate=${2:-1gbit}
bench_steps=${3:-10}

torch_ok=1
scripts/install-bench-deps.sh >/dev/null 2>&1 || torch_ok=0
/usr/bin/python3 -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null ||
  torch_ok=0

cluster_bench_start 4
cp bench/torch_gpt.py "$bench_dir/torch_gpt.py"

# PyTorch on the first HOSTS hosts: one process each, started on its host through the cluster's
# remote shell, meeting rank 0 on node1 (198.18.0.11) over the hosts' eth0. Leaves the job's
# step time and tokens/s in torch_step_s and torch_tokens_s.
torch_train() {
  local hosts=$1 pids=() r
  for r in $(seq 0 $((hosts - 1))); do
    "$CLUSTER_DIR/cluster-rsh-agent" "node$((r + 1))" \
      "GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 /usr/bin/python3 $bench_dir/torch_gpt.py" \
      "--ranks $hosts --rank $r --master 198.18.0.11 --port 29500 --threads 1" \
      "--steps $((bench_steps - 1))" >"$bench_dir/torch-$hosts-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[r]}" || {
      echo "torch DDP on $hosts hosts: rank $r failed:" >&2
      tail -n 20 "$bench_dir/torch-$hosts-$r.out" >&2
      return 1
    }
  done
  # As mantissa's figures: rank 0's median over the steps after the first (mantissa's run of
  # bench_steps logs steps 0..bench_steps-1; torch_gpt.py times bench_steps - 1 after its
  # untimed first), and the whole batch's tokens over it.
  torch_step_s=$(sed -n 's/.* median_step_s=\([0-9.]*\).*/\1/p' "$bench_dir/torch-$hosts-0.out")
  torch_tokens_s=$(awk -v s="$torch_step_s" 'BEGIN { printf "%.0f", 8 * 256 / s }')
}

echo "scaling: 1, 2, 4 hosts x 1 rank x 1 thread on $(nproc) cores, every link $rate (tbf);" \
  "reference GPT, 8 x 256 tokens per step over all ranks, median of steps 1..$((bench_steps - 1))"
"$build/bin/bench_cpu_paths"
# `mantissa plan` of HOSTS CPU ranks (extra options after, e.g. --efficiency, --set): its
# projection line's value of KEY.
plan() {
  local key=$1 hosts=$2
  shift 2
  # shellcheck disable=SC2046 # cluster_bench_model's words are separate arguments
  "$build/bin/mantissa" plan --config "$bench_dir/train.pbtxt" --gpus "$hosts" --gpu cpu \
    --tflops "$peak_tflops" --cores "$(nproc)" --link-gbps "$link_gbps" \
    $(cluster_bench_model "$hosts") "$@" |
    sed -n "s/^projection: .* $key=\([^ ]*\).*/\1/p"
}
peak_tflops=$(OMP_NUM_THREADS=1 "$build/bin/fma_peak" |
  sed -n 's/^fma_peak_gflops=\([0-9.]*\).*/\1/p' | awk '{ print $1 / 1000 }')
# tc's rates: 1gbit, 200mbit, 500kbit.
link_gbps=$(awk -v r="$rate" 'BEGIN {
  n = r + 0; u = tolower(substr(r, length(n "") + 1))
  print n * (u ~ /^g/ ? 1 : u ~ /^m/ ? 1e-3 : u ~ /^k/ ? 1e-6 : 1e-9) }')
echo "mantissa plan: one rank's peak ${peak_tflops} TFLOP/s (FMA, 1 thread), links ${link_gbps} Gbit/s," \
  "$(nproc) cores shared by the ranks"

printf '%-44s %8s %12s %10s %11s %10s %7s\n' "run" "step s" "exposed s" "tokens/s" "efficiency" \
  "plan s" "error"
row() { printf '%-44s %8s %12s %10s %11s %10s %7s\n' "$@"; }
efficiency() { awk -v t="$1" -v n="$2" -v one="$3" 'BEGIN { printf "%.2f", t / (n * one) }'; }
error() { awk -v p="$1" -v m="$2" 'BEGIN { printf "%+.0f%%", 100 * (p / m - 1) }'; }

# The efficiency of 1, 2 and 4 ranks: compute at full peak over the compute part of the
# job's step on unshaped links (step less exposed communication), the mean of two runs.
declare -A fitted
for hosts in 1 2 4; do
  compute_s=()
  for _ in 1 2; do
    cluster_bench_train "x" "$hosts" --set dist.grad_reduce_dtype=BF16 >/dev/null
    compute_s+=("$(awk -v s="$figures_step_s" -v c="$figures_comm_s" 'BEGIN { print s - c }')")
  done
  fitted[$hosts]=$(awk -v ideal="$(plan compute_s "$hosts" --efficiency 1)" \
    -v a="${compute_s[0]}" -v b="${compute_s[1]}" 'BEGIN { printf "%.4f", ideal / ((a + b) / 2) }')
done
cluster_bench_shape "$rate"
cluster_bench_train "mantissa BF16, 1 host" 1 >/dev/null
one=$figures_tokens_s
projected=$(plan step_s 1 --efficiency "${fitted[1]}")
row "mantissa BF16, 1 host" "$figures_step_s" "-" "$one" "1.00" "$projected" \
  "$(error "$projected" "$figures_step_s")"
for hosts in 2 4; do
  for reduce in FP32 BF16 FP8_E4M3; do
    cluster_bench_train "x" "$hosts" --set "dist.grad_reduce_dtype=$reduce" >/dev/null
    projected=$(plan step_s "$hosts" --efficiency "${fitted[$hosts]}" \
      --set "dist.grad_reduce_dtype=$reduce")
    row "mantissa BF16, $hosts hosts, $reduce reduce" "$figures_step_s" "$figures_comm_s" \
      "$figures_tokens_s" "$(efficiency "$figures_tokens_s" "$hosts" "$one")" "$projected" \
      "$(error "$projected" "$figures_step_s")"
  done
done
echo "plan's efficiency fitted on the unshaped jobs of 1, 2 and 4 ranks:" \
  "${fitted[1]}, ${fitted[2]}, ${fitted[4]}"
if [ "$torch_ok" = 1 ]; then
  torch_train 1
  torch_one=$torch_tokens_s
  row "torch FP32, 1 host" "$torch_step_s" "-" "$torch_one" "1.00"
  for hosts in 2 4; do
    torch_train "$hosts"
    row "torch FP32 DDP (gloo), $hosts hosts" "$torch_step_s" "-" "$torch_tokens_s" \
      "$(efficiency "$torch_tokens_s" "$hosts" "$torch_one")"
  done
else
  echo "torch anchor skipped: /usr/bin/python3 has no torch with gloo (scripts/install-bench-deps.sh)"
fi
