#!/usr/bin/env python3
"""Prints docs/plan.md's table: `mantissa plan` of GPT-2 124M (configs/gpt2.pbtxt) and 1.5B
(configs/gpt2-1.5b.pbtxt) on 8 to 1,024 H200s, as Markdown rows.

Each model keeps llm.c's global batch (524,288 tokens for 124M, 1,048,576 for 1.5B) as the GPUs
grow: gradient accumulation, then the micro-batch, shrink until one sequence per GPU is left;
past that the batch grows with the GPUs. Everything else is the shipped config's.

    scripts/plan-table.py [BUILD_DIR]      (default: build)
"""

import os
import re
import subprocess
import sys

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = [("GPT-2 124M", "configs/gpt2.pbtxt", 524288, 16),
          ("GPT-2 1.5B", "configs/gpt2-1.5b.pbtxt", 1048576, 16)]
GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
SEQ_LEN = 1024


def batch(global_tokens, gpus, max_micro):
    """(micro_batch_size, grad_accum_steps) that give each GPU its share of the sequences."""
    per_gpu = max(1, global_tokens // SEQ_LEN // gpus)
    micro = min(per_gpu, max_micro)
    return micro, per_gpu // micro


def projection(binary, config, gpus, micro, accum):
    out = subprocess.run(
        [binary, "plan", "--config", os.path.join(SOURCE, config), "--gpus", str(gpus), "--gpu",
         "h200", "--set", f"data.micro_batch_size={micro}", "--set",
         f"data.grad_accum_steps={accum}"], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("projection: "))
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.e+-]+)", line)}


def rows(binary):
    yield ("| model | H200s | sequences per GPU (micro-batch x accumulation) | tokens per step "
           "| step s | exposed all-reduce s | tokens/s | MFU | memory per GPU GiB |")
    yield "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for name, config, global_tokens, max_micro in MODELS:
        for gpus in GPUS:
            micro, accum = batch(global_tokens, gpus, max_micro)
            p = projection(binary, config, gpus, micro, accum)
            tokens = micro * accum * SEQ_LEN * gpus
            yield (f"| {name} | {gpus} | {micro} x {accum} | {tokens:,} | {p['step_s']:.3f} | "
                   f"{p['exposed_s']:.3f} | {p['tokens_per_s'] / 1e6:.2f}M | {p['mfu']:.2f} | "
                   f"{p['memory_gib']:.1f} |")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    for row in rows(os.path.join(build, "bin", "mantissa")):
        print(row)


if __name__ == "__main__":
    main()
