"""Train chapter 13's byte-level language model with PyTorch on the CPU.

    python -m course_lib.tools.train [--steps 600] [--out course_lib/decoder/weights/byte_lm.npz]

The text is the Python standard library's own source, which ships with every
Python and which nobody on the course wrote: ``model.dataset.TRAIN_FILES`` to
learn from, ``model.dataset.HELDOUT_FILES`` to score on.  The tokens are bytes
(256 of them), so there is no tokenizer to train or ship.

The network is ``model.transformer``'s, written here a second time in torch so
autograd can train it: pre-norm blocks (RMSNorm), grouped-query attention with
rotary positions, a GELU MLP, tied input and output embeddings.  The weights
are saved under the names the numpy model reads, with the configuration, and
the run is written beside them as a record (loss curve, data files and their
SHA-256, seed, wall time, machine, torch version).  Training is reproducible
but never needed to run the course: the weights are committed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import time
from pathlib import Path

import numpy as np

from ..bench.records import environment
from ..decoder import dataset
from ..decoder.transformer import DEFAULT_WEIGHTS, Config

RECORD_NAME = "training.json"  # written beside the weights


def _torch():
    import torch  # training only: the course's kernels and the numpy model never import torch
    return torch


def build(config: Config):
    """The torch module: the same computation as ``transformer.Transformer``."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + config.norm_eps) * self.weight

    def rotate(x, cos, sin):  # x (B, H, T, D); the two halves of D rotate as pairs
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d, hd = config.d_model, config.head_dim
            self.norm1 = RMSNorm(d)
            self.wq = nn.Linear(d, config.n_heads * hd, bias=False)
            self.wk = nn.Linear(d, config.n_kv_heads * hd, bias=False)
            self.wv = nn.Linear(d, config.n_kv_heads * hd, bias=False)
            self.wo = nn.Linear(config.n_heads * hd, d, bias=False)
            self.norm2 = RMSNorm(d)
            self.w1 = nn.Linear(d, config.d_ff, bias=False)
            self.w2 = nn.Linear(config.d_ff, d, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.norm1(x)
            q = self.wq(h).view(B, T, config.n_heads, -1).transpose(1, 2)
            k = self.wk(h).view(B, T, config.n_kv_heads, -1).transpose(1, 2)
            v = self.wv(h).view(B, T, config.n_kv_heads, -1).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            group = config.n_heads // config.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, -1))
            return x + self.w2(F.gelu(self.w1(self.norm2(x)), approximate="tanh"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(config.vocab, config.d_model)
            nn.init.normal_(self.tok_emb.weight, std=0.02)  # tied: small, or the first logits are huge
            self.blocks = nn.ModuleList(Block() for _ in range(config.n_layers))
            self.norm_f = RMSNorm(config.d_model)
            cos, sin = (torch.from_numpy(a) for a in config.rotary_tables(config.context))
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, tokens):
            T = tokens.shape[1]
            x = self.tok_emb(tokens)
            for block in self.blocks:
                x = block(x, self.cos[:T], self.sin[:T])
            return self.norm_f(x) @ self.tok_emb.weight.T  # tied output embedding

    return Net()


def numpy_weights(net) -> dict:
    """The trained parameters under the numpy model's names (float32)."""
    out = {"tok_emb": net.tok_emb.weight, "norm_f": net.norm_f.weight}
    for i, block in enumerate(net.blocks):
        for name in ("wq", "wk", "wv", "wo", "w1", "w2"):
            out[f"layers.{i}.{name}"] = getattr(block, name).weight.T  # x @ W, W (in, out)
        out[f"layers.{i}.norm1"] = block.norm1.weight
        out[f"layers.{i}.norm2"] = block.norm2.weight
    return {k: v.detach().numpy().astype(np.float32) for k, v in out.items()}


def load_numpy_weights(net, weights: dict):
    """Put weights saved by ``numpy_weights`` back into the torch module (its inverse)."""
    torch = _torch()
    with torch.no_grad():
        net.tok_emb.weight.copy_(torch.from_numpy(weights["tok_emb"]))
        net.norm_f.weight.copy_(torch.from_numpy(weights["norm_f"]))
        for i, block in enumerate(net.blocks):
            for name in ("wq", "wk", "wv", "wo", "w1", "w2"):
                getattr(block, name).weight.copy_(torch.from_numpy(weights[f"layers.{i}.{name}"].T.copy()))
            block.norm1.weight.copy_(torch.from_numpy(weights[f"layers.{i}.norm1"]))
            block.norm2.weight.copy_(torch.from_numpy(weights[f"layers.{i}.norm2"]))
    return net


def _windows(data, rng, batch, length):
    """``batch`` random windows of ``length + 1`` bytes: inputs and next-byte targets."""
    starts = rng.integers(0, len(data) - length - 1, size=batch)
    return np.stack([data[s:s + length + 1] for s in starts]).astype(np.int64)


def train(*, steps, batch, lr, seed, out, config, eval_every=50, threads=1):
    """Train, save the weights and the record; return the record."""
    torch = _torch()
    torch.manual_seed(seed)
    torch.set_num_threads(threads)  # the machine is shared
    train_data = np.frombuffer(dataset.read(dataset.TRAIN_FILES), dtype=np.uint8)
    held_data = np.frombuffer(dataset.read(dataset.HELDOUT_FILES), dtype=np.uint8)
    rng = np.random.default_rng(seed)
    held_batch = torch.from_numpy(_windows(held_data, np.random.default_rng(seed + 1), 16, config.context))
    net = build(config)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)

    def lr_at(step):  # linear warm-up, cosine decay to a tenth
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))

    def loss_of(batch_tokens):
        logits = net(batch_tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab), batch_tokens[:, 1:].reshape(-1))

    curve, started = [], time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = loss_of(torch.from_numpy(_windows(train_data, rng, batch, config.context)))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        loss = float(loss.detach())
        if step % eval_every == 0 or step == steps - 1:
            with torch.no_grad():
                held = float(loss_of(held_batch))
            curve.append({"step": step, "train_loss": loss, "heldout_loss": held,
                          "seconds": round(time.perf_counter() - started, 1)})
            print(f"step {step:5d}  train {loss:.3f}  held-out {held:.3f} nats/byte  "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    seconds = time.perf_counter() - started
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, config=np.array(json.dumps(config.as_dict())), **numpy_weights(net))
    record = {
        "what": "training run of chapter 13's byte-level model",
        "command": f"python -m course_lib.tools.train --steps {steps} --batch {batch} --lr {lr} --seed {seed}",
        "config": config.as_dict(), "steps": steps, "batch": batch, "lr": lr, "seed": seed,
        "tokens_seen": steps * batch * config.context, "threads": threads,
        "parameters": int(sum(p.numel() for p in net.parameters())),
        "train_files": dataset.manifest(dataset.TRAIN_FILES),
        "heldout_files": dataset.manifest(dataset.HELDOUT_FILES),
        "python_source": dataset.stdlib_dir().as_posix(),
        "loss_unit": "nats per byte", "curve": curve, "wall_seconds": round(seconds, 1),
        "torch": torch.__version__, "machine": platform.machine(), "environment": environment(),
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    (out.parent / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course_lib.tools.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS))
    args = parser.parse_args(argv)
    train(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, out=args.out,
          config=Config(), threads=args.threads)


if __name__ == "__main__":
    main()
