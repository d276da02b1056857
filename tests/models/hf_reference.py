#!/usr/bin/python3
"""PyTorch references of Hugging Face's GPT2LMHeadModel and LlamaForCausalLM, against mantissa.

Usage: hf_reference.py gpt2|llama --dump BUILD/bin/hf_reference_dump [--work DIR]

For each case of the family, hf_reference_dump (mantissa's side) builds the model on the CPU in
FP32, exports it with `mantissa export --format hf`'s code, and writes a batch with mantissa's
FP32 logits and mean cross-entropy. This script loads only the exported directory
(model.safetensors, parsed here with struct and json; config.json) into its own
implementation of transformers' math, in FP64, and computes the same logits and loss:

  GPT-2: token + position embeddings; per block LayerNorm (eps layer_norm_epsilon), Conv1D
    x @ W + b with W [in, out], causal softmax attention scaled by 1/sqrt(head dim), GELU's
    tanh form ("gelu_new"), residuals; final LayerNorm; LM head tied to wte.
  Llama: token embedding; per block RMSNorm (x / sqrt(mean(x^2) + rms_norm_eps) * w),
    q/k/v/o projections x @ W^T, rotary embeddings on q and k pairing channel i with
    i + head_dim/2 (rotate_half; inv_freq = rope_theta^(-2i/head_dim) and the angles in FP32,
    as transformers computes them), key/value heads repeated (repeat_interleave) for grouped
    queries, causal softmax attention, SwiGLU down(silu(gate(x)) * up(x)); final RMSNorm; LM
    head lm_head.weight, or the embedding when tie_word_embeddings.

Acceptance (issue #15): the loss within 1e-5 relative and every logit within 1e-4 absolute.
Absolute, because softmax only sees logit differences: an absolute error e in a logit scales
its probability by exp(e), about 1 + e, whatever the logit's size, while a relative bound says
nothing about logits near zero and too much about large ones. The reference runs in FP64 so
that what is measured is mantissa's FP32 error (and any layout mistake, which is far larger).

Needs /usr/bin/python3 with torch (Debian's python3-torch, which scripts/setup.sh installs): a
machine without it fails this test, it does not skip it.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:
    sys.exit(f"hf_reference: FAILED: torch is not importable ({e}); scripts/setup.sh installs "
             "Debian's python3-torch for /usr/bin/python3")

LOSS_RTOL = 1e-5
LOGIT_ATOL = 1e-4

# Each case: the model's config fields, the seed of its weights and batch, the batch size.
# Vocabularies not a multiple of 128 leave padding columns to drop; the Llama cases cover
# grouped-query and plain multi-head attention, tied and untied heads, both usual RoPE bases.
CASES = {
    "gpt2": [
        dict(n_layer=2, n_head=4, n_embd=64, seq_len=32, vocab_size=300, seed=11, batch=3),
        dict(n_layer=3, n_head=2, n_embd=32, seq_len=17, vocab_size=256, seed=12, batch=2),
    ],
    "llama": [
        dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=96, seq_len=32,
             vocab_size=300, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=0, seed=21,
             batch=3),
        dict(n_layer=2, n_head=2, n_kv_head=2, n_embd=32, ffn_hidden=64, seq_len=17,
             vocab_size=256, rope_theta=500000.0, norm_eps=1e-6, tie_embeddings=1, seed=22,
             batch=2),
        dict(n_layer=1, n_head=8, n_kv_head=1, n_embd=64, ffn_hidden=128, seq_len=24,
             vocab_size=130, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=0, seed=23,
             batch=2),
    ],
}

DTYPES = {"F32": ("f", 4), "F64": ("d", 8)}


def load_safetensors(path):
    """{name: FP64 tensor} from the file, by the format's definition."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        code, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // size
        values = struct.unpack(f"<{count}{code}", body[begin:end])
        tensors[name] = torch.tensor(values, dtype=torch.float64).reshape(info["shape"])
    return tensors


def causal_attention(q, k, v):
    """q, k, v [B, heads, T, D] -> [B, T, heads * D]."""
    b, h, t, d = q.shape
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(b, t, h * d)


def gpt2_logits(w, config, tokens):
    p = "transformer." if "transformer.wte.weight" in w else ""
    n_head, eps = config["n_head"], config.get("layer_norm_epsilon", 1e-5)
    assert config.get("activation_function", "gelu_new") == "gelu_new"
    b, t = tokens.shape
    c = config["n_embd"]

    def layer_norm(x, name):
        return torch.nn.functional.layer_norm(x, (c,), w[name + ".weight"], w[name + ".bias"], eps)

    def conv1d(x, name):  # transformers' Conv1D: x @ W + b, W [in, out]
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    x = w[p + "wte.weight"][tokens] + w[p + "wpe.weight"][:t]
    for i in range(config["n_layer"]):
        h = f"{p}h.{i}."
        qkv = conv1d(layer_norm(x, h + "ln_1"), h + "attn.c_attn")
        q, k, v = (z.reshape(b, t, n_head, c // n_head).transpose(1, 2) for z in qkv.split(c, -1))
        x = x + conv1d(causal_attention(q, k, v), h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(layer_norm(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    x = layer_norm(x, p + "ln_f")
    return x @ w[p + "wte.weight"].T


def llama_logits(w, config, tokens):
    assert config.get("hidden_act", "silu") == "silu" and config.get("rope_scaling") is None
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    c = config["hidden_size"]
    d = config.get("head_dim", c // n_head)
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    b, t = tokens.shape

    def rms_norm(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

    # transformers' LlamaRotaryEmbedding: inv_freq and position * inv_freq in FP32; cos and sin
    # of those angles (here in FP64).
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq).double()
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()

    def rotate_half(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(x):  # [B, heads, T, D]
        return x * cos + rotate_half(x) * sin

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        l = f"model.layers.{i}."
        h = rms_norm(x, l + "input_layernorm.weight")
        q = (h @ w[l + "self_attn.q_proj.weight"].T).reshape(b, t, n_head, d).transpose(1, 2)
        k = (h @ w[l + "self_attn.k_proj.weight"].T).reshape(b, t, n_kv, d).transpose(1, 2)
        v = (h @ w[l + "self_attn.v_proj.weight"].T).reshape(b, t, n_kv, d).transpose(1, 2)
        q, k = rope(q), rope(k)
        # transformers' repeat_kv: query head j reads key/value head j // (n_head / n_kv).
        k = k.repeat_interleave(n_head // n_kv, dim=1)
        v = v.repeat_interleave(n_head // n_kv, dim=1)
        x = x + causal_attention(q, k, v) @ w[l + "self_attn.o_proj.weight"].T
        h = rms_norm(x, l + "post_attention_layernorm.weight")
        gate = h @ w[l + "mlp.gate_proj.weight"].T
        up = h @ w[l + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[l + "mlp.down_proj.weight"].T
    x = rms_norm(x, "model.norm.weight")
    head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    assert config["tie_word_embeddings"] == ("lm_head.weight" not in w)
    return x @ head.T


def run_case(family, case, dump, work):
    args = [dump, family, work] + [f"{k}={v}" for k, v in case.items()]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    hf = os.path.join(work, "hf")
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    weights = load_safetensors(os.path.join(hf, "model.safetensors"))
    b, t, vocab = case["batch"], case["seq_len"], case["vocab_size"]
    with open(os.path.join(work, "tokens.bin"), "rb") as f:
        sequences = torch.tensor(struct.unpack(f"<{b * (t + 1)}i", f.read())).reshape(b, t + 1)
    with open(os.path.join(work, "logits.bin"), "rb") as f:
        ours = torch.tensor(struct.unpack(f"<{b * t * vocab}f", f.read()),
                            dtype=torch.float64).reshape(b * t, vocab)
    with open(os.path.join(work, "loss.txt")) as f:
        our_loss = float(f.read())

    tokens, targets = sequences[:, :-1], sequences[:, 1:]
    forward = gpt2_logits if family == "gpt2" else llama_logits
    logits = forward(weights, config, tokens).reshape(b * t, -1)
    assert logits.shape == (b * t, vocab), logits.shape
    loss = torch.nn.functional.cross_entropy(logits, targets.reshape(-1)).item()

    logit_error = (logits - ours).abs().max().item()
    loss_error = abs(loss - our_loss) / abs(loss)
    spread = logits.std().item()
    print(f"hf_reference: {family} {case}: loss torch {loss:.9f} mantissa {our_loss:.9f} "
          f"(relative error {loss_error:.2e}, limit {LOSS_RTOL:g}); logits std {spread:.3f}, "
          f"max |error| {logit_error:.2e} (limit {LOGIT_ATOL:g})")
    failures = []
    if not loss_error <= LOSS_RTOL:
        failures.append(f"loss differs by {loss_error:.3e} relative")
    if not logit_error <= LOGIT_ATOL:
        worst = (logits - ours).abs().argmax().item()
        failures.append(f"logit {divmod(worst, vocab)} (row, token) differs by {logit_error:.3e}: "
                        f"torch {logits.reshape(-1)[worst].item():.6f}, mantissa "
                        f"{ours.reshape(-1)[worst].item():.6f}")
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("family", choices=sorted(CASES))
    parser.add_argument("--dump", required=True, help="the hf_reference_dump executable")
    parser.add_argument("--work", help="directory for the exports (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        for i, case in enumerate(CASES[args.family]):
            case_dir = os.path.join(work, f"{args.family}_{i}")
            os.makedirs(case_dir, exist_ok=True)
            failures += [f"{args.family} case {i}: {f}"
                         for f in run_case(args.family, case, args.dump, case_dir)]
    if failures:
        print("hf_reference: FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"hf_reference: {args.family}: {len(CASES[args.family])} cases match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
