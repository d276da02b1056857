#!/usr/bin/python3
"""The PyTorch anchor of mantissa's CPU training benchmarks: the reference GPT, trained the way
bench_train_cpu and bench_dist_train train it, in PyTorch on the CPU. Prints tokens/s.

  /usr/bin/python3 bench/torch_gpt.py [--steps 6] [--threads 2] [--bf16]
  /usr/bin/python3 bench/torch_gpt.py --ranks 2 --threads 1 [--steps 6] [--bf16]
  GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_gpt.py --ranks 2 --rank R \
      --master ADDR --port PORT --threads 1    # one rank per host, each started by the caller

The reference configuration: GPT-2 architecture, vocabulary 256, 256 positions, width 384,
6 layers of 6 heads (10.84M parameters, LM head tied to the token embedding), 8 sequences of
256 tokens per optimizer step over all ranks. Like mantissa: GPT-2 initialisation, LayerNorm
eps 1e-5, tanh GELU, logits and loss in FP32, AdamW (lr 3e-4 on a cosine schedule to 0, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on the matrices only), gradients clipped to norm 1. The
first step (allocations, page faults) is not timed; step_s is the mean of the others,
median_step_s their median (mantissa's cluster benchmarks take medians of its step log), and
import_rss_mib what the process held once PyTorch was loaded (part of peak_rss_mib, with no
counterpart in mantissa's). The tokens are uniformly random: the time of a step does not
depend on them, but the loss stays near ln 256 = 5.55, where mantissa's synthetic corpus lets
it fall.

--bf16 runs forward under torch.autocast(bfloat16), PyTorch's counterpart of mantissa's BF16
policy (FP32 masters, BF16 GEMMs). --ranks N starts N processes of this script (no torchrun:
Debian's is broken on Python 3.11) that train as DistributedDataParallel over gloo on
127.0.0.1, each on 8 / N sequences per step with --threads threads; DDP's 25 MiB gradient
buckets are mantissa's default bucket size too. Each rank prints its line, then the total.
With --rank, this process is that one rank only, meeting the others at --master:--port (rank
0's host): how bench/bench_scaling.sh runs one rank on each host of the test cluster.

Runs on Debian's PyTorch (python3-torch, for /usr/bin/python3) with libopenblas0-pthread:
without OpenBLAS it runs on the reference BLAS, about 15 times slower (the paths line names the
BLAS loaded). scripts/install-bench-deps.sh installs both.
"""

import argparse
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IMPORT_RSS_MIB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

VOCAB, SEQ_LEN, WIDTH, LAYERS, HEADS = 256, 256, 384, 6, 6
GLOBAL_BATCH = 8
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
INIT_STD = 0.02


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.mlp_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, causal_mask):
        b, t, c = x.shape
        head = c // HEADS
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, head).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
        probs = scores.masked_fill(causal_mask[:t, :t], float("-inf")).softmax(dim=-1)
        attended = (probs @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(attended)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ_LEN, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH, eps=1e-5)
        # A plain attribute, not a buffer: DDP would broadcast a buffer, and gloo has no bool.
        self.causal_mask = torch.triu(torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool), 1)
        # GPT-2: matrices N(0, 0.02), the two projections into the residual stream
        # N(0, 0.02 / sqrt(2 layers)) so its variance does not grow with depth, biases 0,
        # LayerNorm gains 1 (nn.LayerNorm's own).
        residual_std = INIT_STD / math.sqrt(2 * LAYERS)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                is_residual = name.endswith(("c_proj.weight", "mlp_proj.weight"))
                nn.init.normal_(p, 0.0, residual_std if is_residual else INIT_STD)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x, self.causal_mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied LM head
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))


def cosine_lr(step, total_steps):
    """mantissa's schedule without warmup: lr * (1 + cos(pi * step / total)) / 2, down to 0."""
    return LR * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))


def blas_library():
    """The BLAS this process loaded, as the dynamic linker resolved it (reference or OpenBLAS)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "blas" in line.rsplit("/", 1)[-1]}
    return ", ".join(sorted(os.path.realpath(p) for p in paths)) or "none loaded"


def paths_line():
    """PyTorch's counterpart of mantissa's "CPU paths" line: the vector ISA of its ATen
    kernels, the BLAS behind its FP32 GEMMs, and whether oneDNN is built in (PyTorch 1.13 runs
    BF16 GEMMs there on CPUs with AVX-512; on AVX2-only CPUs its BF16 autocast trains this
    model at a few dozen tokens/s)."""
    config = torch.__config__.show().split("\n")
    capability = next((line.split(":", 1)[1].strip() for line in config
                       if "CPU capability usage" in line), "unknown")
    onednn = "on" if torch.backends.mkldnn.is_available() else "off"
    return (f"torch {torch.__version__} CPU paths: ATen kernels {capability}, "
            f"BLAS {blas_library()}, oneDNN {onednn}")


def train(args, rank, ranks):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT()
    params = sum(p.numel() for p in model.parameters())
    if ranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                                rank=rank, world_size=ranks)
        model = nn.parallel.DistributedDataParallel(model)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": WEIGHT_DECAY},
              {"params": vectors, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    batch = GLOBAL_BATCH // ranks
    # Each rank its own random windows of SEQ_LEN + 1 tokens (inputs and shifted targets).
    generator = torch.Generator().manual_seed(1 + rank)
    total_steps = args.steps + 1

    def step(index):
        window = torch.randint(0, VOCAB, (batch, SEQ_LEN + 1), generator=generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(window[:, :-1], window[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(index, total_steps)
        optimizer.step()
        return loss.item()

    step(0)
    seconds = []
    for index in range(1, total_steps):
        start = time.perf_counter()
        loss = step(index)
        seconds.append(time.perf_counter() - start)
    step_seconds = sum(seconds) / len(seconds)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    where = f" DDP rank {rank}/{ranks}" if ranks > 1 else ""
    if rank == 0:
        print(paths_line(), flush=True)
    print(f"torch {'BF16 autocast' if args.bf16 else 'FP32'}{where}: params={params} "
          f"threads={torch.get_num_threads()} step_s={step_seconds:.4f} "
          f"tokens_per_s={batch * SEQ_LEN / step_seconds:.1f} loss={loss:.4f} "
          f"peak_rss_mib={peak_mib:.1f} import_rss_mib={IMPORT_RSS_MIB:.1f} "
          f"median_step_s={statistics.median(seconds):.4f}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(args):
    """Starts one process of this script per rank and prints their lines and the total."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    # Gloo connects the ranks over the interface its host name resolves to unless told otherwise.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps),
               "--threads", str(args.threads), "--ranks", str(args.ranks), "--port", str(port)]
    if args.bf16:
        command.append("--bf16")
    workers = [subprocess.Popen(command + ["--rank", str(r)], env=env, stdout=subprocess.PIPE,
                                text=True) for r in range(args.ranks)]
    outputs = [w.communicate()[0] for w in workers]
    failed = [r for r, w in enumerate(workers) if w.returncode != 0]
    for out in outputs:
        sys.stdout.write(out)
    if failed:
        sys.exit(f"torch_gpt: DDP rank(s) {failed} failed (their errors are above)")
    rates = [float(line.split("tokens_per_s=")[1].split()[0])
             for out in outputs for line in out.splitlines() if "tokens_per_s=" in line]
    print(f"torch {'BF16 autocast' if args.bf16 else 'FP32'} DDP total: {args.ranks} ranks x "
          f"{args.threads} thread{'s' if args.threads > 1 else ''} "
          f"tokens_per_s={sum(rates):.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after one untimed)")
    parser.add_argument("--threads", type=int, default=2, help="threads per process")
    parser.add_argument("--bf16", action="store_true", help="forward under BF16 autocast")
    parser.add_argument("--ranks", type=int, default=1, help="DDP processes over gloo")
    parser.add_argument("--rank", type=int,
                        help="this process's rank, the others started elsewhere (default: start "
                             "all --ranks here)")
    parser.add_argument("--port", type=int, help="rank 0's port (with --rank)")
    parser.add_argument("--master", default="127.0.0.1",
                        help="rank 0's address (with --rank: ranks on several hosts)")
    args = parser.parse_args()
    if args.steps < 1 or args.threads < 1 or args.ranks < 1 or GLOBAL_BATCH % args.ranks:
        parser.error(f"--steps and --threads must be >= 1, and --ranks must divide the "
                     f"{GLOBAL_BATCH} sequences of a step")
    if args.rank is not None and args.ranks > 1 and args.port is None:
        parser.error("--rank needs --port (and --master when rank 0 runs on another host)")
    if args.ranks > 1 and args.rank is None:
        run_ranks(args)
    else:
        train(args, args.rank or 0, args.ranks)


if __name__ == "__main__":
    main()
