"""One attention layer trained with the course's forward and backward (chapter 12's last section).

The layer is multi-head self-attention with its projections, in numpy:

    q, k, v = x Wq, x Wk, x Wv        split into heads: (B, H, N, D) each
    o = attention(q, k, v, causal)     the course's forward, returning lse
    y = o Wo                           heads joined back: (B, N, d_model)

and the loss is the mean squared error against a teacher layer's output on the
same x.  ``loss_and_grads`` runs the forward, keeps (out, lse) as FlashAttention
keeps them, and gets dq, dk, dv from ``course_lib.attention_backward``; the
projections' gradients are plain matmuls.  ``train`` fits the layer with Adam.
The chapter trains the same layer, from the same start, with PyTorch's autograd
and puts the two loss curves side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..api import attention, attention_backward

PARAMS = ("Wq", "Wk", "Wv", "Wo")


@dataclass(frozen=True)
class LayerShape:
    d_model: int = 32
    heads: int = 4
    head_dim: int = 8
    seqlen: int = 32
    batch: int = 8


def init_params(shape: LayerShape, rng, dtype=np.float32) -> dict:
    """Random projections, scaled so that q k^T starts near unit variance."""
    d, hd = shape.d_model, shape.heads * shape.head_dim
    sizes = {"Wq": (d, hd), "Wk": (d, hd), "Wv": (d, hd), "Wo": (hd, d)}
    return {name: (rng.standard_normal(size) / np.sqrt(size[0])).astype(dtype) for name, size in sizes.items()}


def _heads(x, shape):   # (B, N, H * D) -> (B, H, N, D)
    return np.ascontiguousarray(x.reshape(x.shape[0], x.shape[1], shape.heads, shape.head_dim).transpose(0, 2, 1, 3))


def _join(x):           # (B, H, N, D) -> (B, N, H * D)
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def layer(params, x, shape, *, causal=True, impl="flash_numpy", return_saved=False):
    """y = attention(x Wq, x Wk, x Wv) Wo; with ``return_saved`` also what the backward needs."""
    q, k, v = (_heads(x @ params[w], shape) for w in ("Wq", "Wk", "Wv"))
    o, lse = attention(q, k, v, impl=impl, causal=causal, return_lse=True)
    y = _join(o) @ params["Wo"]
    return (y, (q, k, v, o, lse)) if return_saved else y


def loss_and_grads(params, x, target, shape, *, causal=True, impl="flash_numpy", backward_impl="flash_numpy"):
    """(mean squared error, gradient of each parameter), through the course's attention backward."""
    y, (q, k, v, o, lse) = layer(params, x, shape, causal=causal, impl=impl, return_saved=True)
    diff = y - target
    loss = float(np.mean(diff.astype(np.float64) ** 2))
    dy = (2 / diff.size) * diff                                     # (B, N, d_model)
    grads = {"Wo": np.einsum("bnh,bnd->hd", _join(o), dy)}
    do = _heads(dy @ params["Wo"].T, shape)                          # (B, H, N, D)
    dq, dk, dv = attention_backward(q, k, v, o, lse, do.astype(q.dtype), impl=backward_impl, causal=causal)
    for name, g in (("Wq", dq), ("Wk", dk), ("Wv", dv)):
        grads[name] = np.einsum("bnd,bnh->dh", x, _join(g))
    return loss, grads


class Adam:
    """Adam, as ``torch.optim.Adam`` computes it (no weight decay)."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0
        self.m = {n: np.zeros_like(p) for n, p in params.items()}
        self.v = {n: np.zeros_like(p) for n, p in params.items()}

    def step(self, params, grads):
        self.t += 1
        b1, b2 = self.betas
        for n in params:
            self.m[n] = b1 * self.m[n] + (1 - b1) * grads[n]
            self.v[n] = b2 * self.v[n] + (1 - b2) * grads[n] ** 2
            m_hat = self.m[n] / (1 - b1 ** self.t)
            v_hat = self.v[n] / (1 - b2 ** self.t)
            params[n] = (params[n] - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(params[n].dtype)


def task(shape: LayerShape, seed=0, dtype=np.float32):
    """(x, target, start): inputs, a teacher layer's outputs on them, and the student's first parameters."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shape.batch, shape.seqlen, shape.d_model)).astype(dtype)
    teacher = init_params(shape, rng, dtype)
    target = layer(teacher, x, shape, impl="reference")
    return x, target, init_params(shape, rng, dtype)


def train(x, target, start, shape, *, steps=300, lr=1e-2, causal=True, impl="flash_numpy",
          backward_impl="flash_numpy") -> np.ndarray:
    """Fit the layer from ``start`` with Adam; returns the loss before each step."""
    params = {n: w.copy() for n, w in start.items()}
    optimizer = Adam(params, lr=lr)
    losses = np.empty(steps)
    for step in range(steps):
        losses[step], grads = loss_and_grads(params, x, target, shape, causal=causal, impl=impl,
                                             backward_impl=backward_impl)
        optimizer.step(params, grads)
    return losses
