"""All-to-all over heads (DeepSpeed-Ulysses): trade the sequence axis for the head axis and back.

Each rank comes in holding a contiguous slice of the sequence for every head,
(B, H, N/W, D).  One all-to-all gives it *every* position for H/W of the
heads, (B, H/W, N, D): heads are independent, so it runs ordinary full-length
attention on them (the causal mask needs no care: the whole sequence is
there).  A second all-to-all sends each output row back to the rank that
owns its position: (B, H, N/W, Dv) again.

It needs H (and, for K and V, heads_k) divisible by W, moves every Q, K, V
and output element once, whatever W, in 4 collective calls (q, k, v, then
out with lse beside it), while the ring moves K and V W - 1 times in W - 1
point-to-point steps: ``costmodel`` weighs the two.
"""
from __future__ import annotations

import time

import numpy as np

from ..core.rules import lse_dtype
from .shard_attention import local_partial


def _all_to_all(x, split_axis, concat_axis, device):
    """Cut x into W parts along ``split_axis``, send part g to rank g, and join what arrives along
    ``concat_axis`` in rank order."""
    import torch
    import torch.distributed as dist
    world_size = dist.get_world_size()
    parts = np.stack(np.split(x, world_size, axis=split_axis))       # (W, ...) part g for rank g
    send = torch.from_numpy(np.ascontiguousarray(parts)).to(device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    got = recv.cpu().numpy() if recv.device.type != "cpu" else recv.numpy()
    return np.concatenate(list(got), axis=concat_axis)


def check_heads(heads, heads_k, world_size):
    """Ulysses deals whole heads: both head counts must split evenly over the ranks."""
    if heads % world_size or heads_k % world_size:
        raise ValueError(f"all-to-all over heads needs heads ({heads}) and heads_k ({heads_k}) divisible by "
                         f"the world size ({world_size}); use the ring, or fewer ranks")


def ulysses_attention(q, k, v, *, causal=False, impl="flash_numpy", device="cpu"):
    """This rank's (out, lse) for its sequence slice q, k, v (B, H, N/W, D), and its timings."""
    import torch.distributed as dist
    check_heads(q.shape[1], k.shape[1], dist.get_world_size())
    start = time.perf_counter()
    # sequence-sharded -> head-sharded: split heads (axis 1), join the sequence (axis 2)
    qh, kh, vh = (_all_to_all(x, 1, 2, device) for x in (q, k, v))
    t0 = time.perf_counter()
    out, lse = local_partial(qh, kh, vh, 0, causal=causal, impl=impl)   # all of the sequence: d = 0
    t1 = time.perf_counter()
    # head-sharded -> sequence-sharded, lse travelling as one more column of out
    acc = lse_dtype(q.dtype)
    both = np.concatenate([out.astype(acc), lse[..., None].astype(acc)], axis=-1)
    back = _all_to_all(both, 2, 1, device)
    out_local, lse_local = back[..., :-1].astype(q.dtype), back[..., -1]
    end = time.perf_counter()
    return (out_local, lse_local), {"compute_s": [t1 - t0], "wait_s": [(t0 - start) + (end - t1)],
                                    "wall_s": end - start}
