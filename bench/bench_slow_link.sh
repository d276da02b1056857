#!/usr/bin/env bash
# Gradient sync over a slow link, on the test cluster (scripts/start-cluster.sh): 2 hosts x 1
# rank, every host's link limited to RATE (default 200mbit) by tc tbf, the reference GPT of
# bench/cluster_bench.sh (10.84M parameters, 8 x 256 tokens per step, BF16 compute) with
# 4 MiB gradient buckets (dist.bucket_mb=4: backward fills the first one sooner than 25 MiB).
# One run each of:
#   BF16 reduce with overlap (the default), and without it (dist.overlap=false): overlap pays
#     when the step with it takes at most 0.8x the step without;
#   BF16 reduce with overlap but no progress thread (MANTISSA_MPI_PROGRESS_THREAD=0): Open MPI
#     then moves a bucket only while the rank is inside MPI, between layers;
#   FP32 and FP8 (E4M3) reduce with overlap: BF16 should beat FP32, FP8 beat BF16.
# Prints each run's median step time, the communication backward did not hide and tokens/s,
# then the ratios. Figures only (timings on a shared machine are noisy: compare the ratios of
# one run). As root; takes about 2 minutes.
#   bench/bench_slow_link.sh [build dir] [RATE] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cluster_bench.sh
cluster_bench_enter "$@"
build=${1:-build}
rate=${2:-200mbit}
bench_steps=${3:-6}

cluster_bench_start 2
cluster_bench_shape "$rate"
echo "slow link: 2 hosts x 1 rank, every link $rate (tbf); reference GPT, BF16 compute," \
  "8 x 256 tokens per step, dist.bucket_mb=4, median of steps 1..$((bench_steps - 1))"
"$build/bin/bench_cpu_paths"
cluster_bench_header
bucket=(--set dist.bucket_mb=4)
cluster_bench_train "BF16 reduce, overlap" 2 "${bucket[@]}" --set dist.grad_reduce_dtype=BF16
bf16=$figures_step_s
cluster_bench_train "BF16 reduce, no overlap" 2 "${bucket[@]}" --set dist.grad_reduce_dtype=BF16 \
  --set dist.overlap=false
bf16_serial=$figures_step_s
MANTISSA_MPI_PROGRESS_THREAD=0 cluster_bench_train "BF16 reduce, overlap, no progress thread" 2 \
  "${bucket[@]}" --set dist.grad_reduce_dtype=BF16
bf16_no_thread=$figures_step_s
cluster_bench_train "FP32 reduce, overlap" 2 "${bucket[@]}" --set dist.grad_reduce_dtype=FP32
fp32=$figures_step_s
cluster_bench_train "FP8 (E4M3) reduce, overlap" 2 "${bucket[@]}" --set dist.grad_reduce_dtype=FP8_E4M3
fp8=$figures_step_s

echo "step time, overlap / no overlap (BF16):            $(ratio "$bf16" "$bf16_serial") (pays at <= 0.8)"
echo "step time, overlap without / with progress thread:  $(ratio "$bf16_no_thread" "$bf16")"
echo "step time, BF16 / FP32 reduce:                      $(ratio "$bf16" "$fp32") (BF16 beats FP32 below 1)"
echo "step time, FP8 / BF16 reduce:                       $(ratio "$fp8" "$bf16") (FP8 beats BF16 below 1)"
