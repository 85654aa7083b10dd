"""Chapter 12's training run as a record: one attention layer fitted with the course's backward and with PyTorch's autograd.

    .venv/bin/python benchmarks/backward_training.py              # 3 alternated rounds (well under a minute, 2 cores)
    .venv/bin/python benchmarks/backward_training.py --rounds 5

The task is chapter 12's last section, from the same code path
(``course_lib.backward.training``): multi-head self-attention with its
projections, causal, float32, fitted to a teacher layer's outputs by mean squared
error with Adam (``LayerShape()``: d_model 32, 4 heads of 8, 32 tokens, batch 8;
200 steps, lr 1e-2, seed 0), two ways from the same start:

- ``course``: ``training.train``: the course's forward keeps (out, lse),
  ``attention_backward`` (impl ``flash_numpy``) gives dq, dk, dv, the
  projections' gradients are matmuls, Adam as ``torch.optim.Adam`` computes it;
- ``torch``: the same layer in PyTorch, ``scaled_dot_product_attention`` with
  ``is_causal``, gradients from autograd, ``torch.optim.Adam``.

Each training is a worker process of its own and the rounds alternate the two,
so that a load that comes and goes hits both alike.  One record per path to
``notebooks/records/backward_training.jsonl``: the loss before every step (from
the first round; ``losses_repeat`` says whether every round gave the same
curve), the seconds per step of every round with their min / median / max, and
for the course path the largest relative gap between its curve and autograd's,
and its gradients at the start against the float64 reference backward (the
float64 chain through ``impl="reference"``).  The load average before and after
is in ``environment``.  A benchmark, not a test: nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "backward_training.jsonl"
PATHS = ("course", "torch")
STEPS, LR, SEED = 200, 1e-2, 0


def train_course(x, target, start, shape, steps):
    from course_lib.backward import training
    return training.train(x, target, start, shape, steps=steps, lr=LR).tolist()


def train_torch(x, target, start, shape, steps):
    import torch
    params = {name: torch.tensor(w, requires_grad=True) for name, w in start.items()}
    optimizer = torch.optim.Adam(params.values(), lr=LR)
    tx, ttarget = torch.tensor(x), torch.tensor(target)

    def split(z):   # (B, N, H * D) -> (B, H, N, D)
        return z.reshape(shape.batch, shape.seqlen, shape.heads, shape.head_dim).transpose(1, 2)
    losses = []
    for _ in range(steps):
        o = torch.nn.functional.scaled_dot_product_attention(*(split(tx @ params[w]) for w in ("Wq", "Wk", "Wv")),
                                                             is_causal=True)
        loss = ((o.transpose(1, 2).reshape(shape.batch, shape.seqlen, -1) @ params["Wo"] - ttarget) ** 2).mean()
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return losses


def worker(path, steps):
    """One training on one path, after one warm-up step: its losses and seconds, as JSON on stdout."""
    from course_lib.backward import training
    shape = training.LayerShape()
    x, target, start = training.task(shape, seed=SEED)
    fit = {"course": train_course, "torch": train_torch}[path]
    fit(x, target, start, shape, 1)
    begin = time.perf_counter()
    losses = fit(x, target, start, shape, steps)
    print(json.dumps({"path": path, "seconds": time.perf_counter() - begin, "losses": losses}))


def gradient_error():
    """Largest relative error of the course's float32 gradients at the start, against the float64 chain."""
    from course_lib.backward import training
    shape = training.LayerShape()
    x, target, start = training.task(shape, seed=SEED)
    _, ours = training.loss_and_grads(start, x, target, shape)
    as64 = {n: w.astype(np.float64) for n, w in start.items()}
    _, exact = training.loss_and_grads(as64, x.astype(np.float64), target.astype(np.float64), shape,
                                       impl="reference", backward_impl="reference")
    return {n: float(np.max(np.abs(ours[n] - exact[n])) / np.max(np.abs(exact[n]))) for n in training.PARAMS}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.steps)
    from course_lib import bench
    from course_lib.backward import training
    from course_lib.bench.peers import torch_or_none
    run, env = bench.new_run(), bench.environment()
    env["torch"] = torch_or_none().__version__
    env["load_average"] = list(os.getloadavg())
    got = {path: [] for path in PATHS}
    for _ in range(args.rounds):
        for path in PATHS:
            out = subprocess.run([sys.executable, __file__, "--worker", path, "--steps", str(args.steps)],
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                                 check=True).stdout
            got[path].append(json.loads(out.strip().splitlines()[-1]))
    env["load_average_end"] = list(os.getloadavg())
    shape = training.LayerShape()
    curves = {path: np.array(rounds[0]["losses"]) for path, rounds in got.items()}
    gap = float(np.max(np.abs(curves["course"] - curves["torch"]) / curves["torch"]))
    grads = gradient_error()
    with bench.RecordFile(args.out) as out:
        for path, rounds in got.items():
            ms = [r["seconds"] / args.steps * 1e3 for r in rounds]
            rec = {"benchmark": "backward_training", "run": run, "run_id": run, "device": env.get("cpu"),
                   "environment": env, "path": path, "layer": "end to end",
                   "step": "one Adam step: the layer forward, the loss, the backward, the update",
                   "impl": "flash_numpy (forward and attention_backward)" if path == "course"
                   else "torch SDPA (is_causal) + autograd",
                   "shape": vars(shape), "causal": True, "dtype": "float32", "steps": args.steps, "lr": LR,
                   "seed": SEED, "losses": rounds[0]["losses"],
                   "losses_repeat": all(r["losses"] == rounds[0]["losses"] for r in rounds),
                   "first_loss": rounds[0]["losses"][0], "last_loss": rounds[0]["losses"][-1],
                   "step_ms": ms, "rounds": len(ms), **bench.spread(ms, "ms")}
            if path == "course":
                rec["max_rel_gap_vs_torch"] = gap
                rec["grad_max_rel_err_vs_float64"] = grads
            out.write(rec)
            print(f"{path:6s} loss {rec['first_loss']:.3f} -> {rec['last_loss']:.5f}; ms per step min {rec['min_ms']:.2f} "
                  f"median {rec['median_ms']:.2f} max {rec['max_ms']:.2f}")
    print(f"largest relative gap between the curves {gap:.1e}; course gradients vs float64: "
          + ", ".join(f"{n} {e:.1e}" for n, e in grads.items()))
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
