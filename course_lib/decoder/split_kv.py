"""Split-KV decode: one query row, many keys, the keys shared out over the cores.

A decode step has one query per sequence and head, so a kernel parallel over
(batch, heads, query tiles) has B * H work items: at batch 1 with 4 heads it
keeps 4 cores busy however long the cache grows.  Flash-Decoding splits the
*keys* instead: each worker attends the query to one chunk of the cache and
returns its (out, lse); chapter 04's merge (``online_softmax.merge_all``)
combines the chunks exactly, whatever the split.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..api import attention
from ..core import online_softmax


def chunks(n, splits) -> list:
    """(start, stop) of ``splits`` nearly equal, non-empty key ranges covering 0 .. n."""
    splits = max(1, min(int(splits), n))
    edges = np.linspace(0, n, splits + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def split_kv_decode(q, k, v, *, splits=None, impl="flash_numpy", workers=None, return_lse=False):
    """Decode attention of q (B, H, 1, D) over k / v (B, H_kv, N, D), the N keys split ``splits`` ways.

    The query sees every key (decode's causal row), so each chunk is an
    unmasked call of ``impl``; the chunks run on ``workers`` threads
    (default: the machine's cores) and merge by their lse.
    """
    if q.ndim != 4 or q.shape[2] != 1:
        raise ValueError(f"split-KV is a decode path: q must be (B, H, 1, D), got shape {q.shape}")
    n = k.shape[2]
    if n == 0:
        raise ValueError("split-KV decode needs at least one cached key")
    workers = workers or os.cpu_count() or 1
    pieces = chunks(n, splits or workers)

    def part(bounds):
        a, b = bounds
        return attention(q, k[:, :, a:b], v[:, :, a:b], impl=impl, return_lse=True)

    if workers == 1 or len(pieces) == 1:
        results = [part(p) for p in pieces]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(part, pieces))
    out, lse = online_softmax.merge_all([r[0].astype(np.float32) for r in results],
                                        [r[1].astype(np.float32) for r in results])
    out = out.astype(q.dtype)
    return (out, lse) if return_lse else out
