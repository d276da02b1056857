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
bench_steps=${3:-6}

torch_ok=1
scripts/install-bench-deps.sh >/dev/null 2>&1 || torch_ok=0
/usr/bin/python3 -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null ||
  torch_ok=0

cluster_bench_start 4
cluster_bench_shape "$rate"
cp bench/torch_gpt.py "$bench_dir/torch_gpt.py"

# PyTorch on the first HOSTS hosts: one process each, started on its host through the cluster's
# remote shell, meeting rank 0 on node1 (198.18.0.11) over the hosts' eth0. Leaves the job's
# tokens/s (the ranks' sum) in torch_tokens_s.
torch_train() {
  local hosts=$1 pids=() r out
  for r in $(seq 0 $((hosts - 1))); do
    "$CLUSTER_DIR/cluster-rsh-agent" "node$((r + 1))" \
      "GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 /usr/bin/python3 $bench_dir/torch_gpt.py" \
      "--ranks $hosts --rank $r --master 198.18.0.11 --port 29500 --threads 1" \
      "--steps $bench_steps" >"$bench_dir/torch-$hosts-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[r]}" || {
      echo "torch DDP on $hosts hosts: rank $r failed:" >&2
      tail -n 20 "$bench_dir/torch-$hosts-$r.out" >&2
      return 1
    }
  done
  out=$(cat "$bench_dir"/torch-"$hosts"-*.out)
  torch_tokens_s=$(sed -n 's/.* tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$out" |
    awk '{ sum += $1 } END { printf "%.0f", sum }')
  torch_step_s=$(sed -n 's/.* step_s=\([0-9.]*\).*/\1/p' <<<"$out" | sort -n | tail -n 1)
}

echo "scaling: 1, 2, 4 hosts x 1 rank x 1 thread on $(nproc) cores, every link $rate (tbf);" \
  "reference GPT, 8 x 256 tokens per step over all ranks, median of steps 1..$((bench_steps - 1))"
"$build/bin/bench_cpu_paths"
printf '%-44s %8s %12s %10s %11s\n' "run" "step s" "exposed s" "tokens/s" "efficiency"
row() { printf '%-44s %8s %12s %10s %11s\n' "$@"; }
efficiency() { awk -v t="$1" -v n="$2" -v one="$3" 'BEGIN { printf "%.2f", t / (n * one) }'; }

cluster_bench_train "mantissa BF16, 1 host" 1 >/dev/null
one=$figures_tokens_s
row "mantissa BF16, 1 host" "$figures_step_s" "-" "$one" "1.00"
for hosts in 2 4; do
  for reduce in FP32 BF16 FP8_E4M3; do
    cluster_bench_train "x" "$hosts" --set "dist.grad_reduce_dtype=$reduce" >/dev/null
    row "mantissa BF16, $hosts hosts, $reduce reduce" "$figures_step_s" "$figures_comm_s" \
      "$figures_tokens_s" "$(efficiency "$figures_tokens_s" "$hosts" "$one")"
  done
done
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
