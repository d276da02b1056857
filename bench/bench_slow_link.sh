#!/usr/bin/env bash
# Gradient sync over slow links, on the test cluster (scripts/start-cluster.sh): 2 hosts x 1
# rank, every host's link limited by tc tbf, the reference GPT of bench/cluster_bench.sh
# (10.84M parameters, 8 x 256 tokens per step, BF16 compute) with 4 MiB gradient buckets
# (dist.bucket_mb=4: backward fills the first one sooner than 25 MiB). Each question is asked
# at the rate where it matters most:
#   at OVERLAP_RATE (default 400mbit, where the BF16 gradients' time on the wire, about 0.43 s,
#   is backward's own): BF16 reduce with overlap (the default) and without it
#   (dist.overlap=false), overlap paying when the step with it takes at most 0.8x the step
#   without; and with overlap but no progress thread (MANTISSA_MPI_PROGRESS_THREAD=0: Open MPI
#   then moves a bucket only while the rank is inside MPI, between layers). On a slower link
#   backward cannot hide more than its own length, so the ratio rises towards 1;
#   at REDUCE_RATE (default 200mbit, where the wire outlasts backward and most of it is
#   exposed): FP32, BF16 and FP8 (E4M3) reduce with overlap; BF16 should beat FP32, FP8 beat
#   BF16.
# Prints each run's median step time, the communication backward did not hide and tokens/s,
# then the ratios. Figures only (timings on a shared machine are noisy: compare the ratios of
# one run). As root; takes about 3 minutes.
#   bench/bench_slow_link.sh [build dir] [OVERLAP_RATE] [REDUCE_RATE] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cluster_bench.sh
cluster_bench_enter "$@"
build=${1:-build}
overlap_rate=${2:-400mbit}
reduce_rate=${3:-200mbit}
bench_steps=${4:-6}

cluster_bench_start 2
echo "slow links: 2 hosts x 1 rank, every link $overlap_rate, then $reduce_rate (tbf);" \
  "reference GPT, BF16 compute, 8 x 256 tokens per step, dist.bucket_mb=4," \
  "median of steps 1..$((bench_steps - 1))"
"$build/bin/bench_cpu_paths"
cluster_bench_header
bucket=(--set dist.bucket_mb=4)

cluster_bench_shape "$overlap_rate"
cluster_bench_train "$overlap_rate BF16 reduce, overlap" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=BF16
overlap=$figures_step_s
cluster_bench_train "$overlap_rate BF16 reduce, no overlap" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=BF16 --set dist.overlap=false
serial=$figures_step_s
MANTISSA_MPI_PROGRESS_THREAD=0 cluster_bench_train \
  "$overlap_rate BF16 overlap, no progress thread" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=BF16
no_thread=$figures_step_s

cluster_bench_shape "$reduce_rate"
cluster_bench_train "$reduce_rate FP32 reduce, overlap" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=FP32
fp32=$figures_step_s
cluster_bench_train "$reduce_rate BF16 reduce, overlap" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=BF16
bf16=$figures_step_s
cluster_bench_train "$reduce_rate FP8 (E4M3) reduce, overlap" 2 "${bucket[@]}" \
  --set dist.grad_reduce_dtype=FP8_E4M3
fp8=$figures_step_s

echo "$overlap_rate: step time, overlap / no overlap (BF16):         $(ratio "$overlap" "$serial") (pays at <= 0.8)"
echo "$overlap_rate: step time, overlap without / with progress thread: $(ratio "$no_thread" "$overlap")"
echo "$reduce_rate: step time, BF16 / FP32 reduce:                   $(ratio "$bf16" "$fp32") (BF16 beats FP32 below 1)"
echo "$reduce_rate: step time, FP8 / BF16 reduce:                    $(ratio "$fp8" "$bf16") (FP8 beats BF16 below 1)"
