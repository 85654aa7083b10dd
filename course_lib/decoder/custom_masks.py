"""Masks the kernels' options do not name, and the two ways to run them.

A document mask (several documents packed in one row, each causal and blind to
the others) and a prefix-LM mask (the first ``prefix`` tokens see each other
both ways, the rest are causal) are not ``causal`` / ``window_size`` masks.
There are two ways to run one:

- the fast path: rewrite it as calls the kernels already skip tiles for.  A
  document mask is a packed varlen batch (``attention_varlen``, causal): tiles
  across documents are never visited.  A prefix-LM mask is two calls: the
  prefix rows attend, unmasked, to the prefix keys; the other rows attend
  causally (bottom-right aligned) to all keys.
- the slow path: materialise the (N, N) boolean mask and the full score
  matrix, as a framework does when it is handed an arbitrary mask tensor.  No
  tile is skipped and S costs N^2 memory.

``tile_counts`` says how many (block_q x block_k) tiles each path computes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..api import attention, attention_varlen
from ..core import rules
from ..core.masks import MaskSpec


@dataclass(frozen=True)
class DocumentMask:
    """Documents of ``lengths`` tokens packed in one sequence, each causal, none seeing another."""
    lengths: tuple

    def visible(self, n) -> np.ndarray:
        doc = np.repeat(np.arange(len(self.lengths)), self.lengths)
        if len(doc) != n:
            raise ValueError(f"document lengths sum to {len(doc)}, the sequence has {n} tokens")
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        return (doc[:, None] == doc[None, :]) & (j <= i)

    def fast(self, q, k, v, impl):
        """Packed varlen: q (B, H, N, D) -> the documents as one varlen batch per row of B."""
        cu = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int32)
        outs = []
        for b in range(q.shape[0]):
            packed = [x[b].transpose(1, 0, 2) for x in (q, k, v)]  # (N, H, D)
            out = attention_varlen(*packed, cu, cu, impl=impl, causal=True)
            outs.append(out.transpose(1, 0, 2))
        return np.stack(outs)

    def fast_tiles(self, n, block_q, block_k) -> int:
        return sum(_visited(MaskSpec(L, L, causal=True), block_q, block_k) for L in self.lengths if L)


@dataclass(frozen=True)
class PrefixLMMask:
    """The first ``prefix`` tokens see each other both ways; every later token is causal."""
    prefix: int

    def visible(self, n) -> np.ndarray:
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        return (j <= i) | ((i < self.prefix) & (j < self.prefix))

    def fast(self, q, k, v, impl):
        P = self.prefix
        head = attention(q[:, :, :P], k[:, :, :P], v[:, :, :P], impl=impl, causal=False)
        tail = attention(q[:, :, P:], k, v, impl=impl, causal=True)  # row P + i sees keys <= P + i
        return np.concatenate([head, tail], axis=2)

    def fast_tiles(self, n, block_q, block_k) -> int:
        P = self.prefix
        return (_visited(MaskSpec(P, P), block_q, block_k)
                + _visited(MaskSpec(n - P, n, causal=True), block_q, block_k))


def _visited(spec, block_q, block_k) -> int:
    """Tiles a skipping kernel computes: those not empty under ``spec``."""
    if spec.seqlen_q == 0 or spec.seqlen_k == 0:
        return 0
    return int((np.asarray(spec.tile_codes(block_q, block_k)) != rules.EMPTY).sum())


def dense_masked_attention(q, k, v, visible):
    """The slow path: S = scale q k^T in full (float32), hidden entries -inf, softmax, P V.

    q (B, H, N, D), k / v (B, H_kv, N, D), visible (N, N) bool.  A row that sees
    nothing gives 0.
    """
    B, H, N, D = q.shape
    group = H // k.shape[1]
    acc = np.float64 if q.dtype == np.float64 else np.float32
    kk = np.repeat(k.astype(acc), group, axis=1)
    vv = np.repeat(v.astype(acc), group, axis=1)
    s = (q.astype(acc) @ kk.transpose(0, 1, 3, 2)) * acc(1.0 / np.sqrt(D))
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return ((p / np.where(l == 0, 1, l)) @ vv).astype(q.dtype)


def tile_counts(mask, n, block_q=64, block_k=64) -> dict:
    """Tiles each path computes for an (n x n) mask: the slow path all of them."""
    all_tiles = -(-n // block_q) * -(-n // block_k)
    visible = mask.visible(n)
    needed = sum(bool(visible[r:r + block_q, c:c + block_k].any())
                 for r in range(0, n, block_q) for c in range(0, n, block_k))
    return {"dense": all_tiles, "fast": mask.fast_tiles(n, block_q, block_k), "with_a_visible_pair": needed}


def masked_attend(mask, path, impl):
    """attend(q, k, v) for the model: ``path`` "fast" (tile-skipping calls) or "dense" (the slow path)."""
    if path == "fast":
        return lambda q, k, v, causal=True: mask.fast(q, k, v, impl)
    if path == "dense":
        return lambda q, k, v, causal=True: dense_masked_attention(q, k, v, mask.visible(q.shape[2]))
    raise ValueError(f"path must be 'fast' or 'dense', got {path!r}")

