"""Ring attention on torch.distributed: Q stays, K/V shards travel round the ring.

At step t rank r holds the K/V shard of rank r - t (``sharding.ring_source``),
folds it into its (out, lse) with ``shard_attention.attend_shard``, and passes
it on to rank r + 1 while receiving the next one from rank r - 1.  After W
steps every rank has seen every shard, and its (out, lse) are those of full
attention for its rows.

With ``overlap`` the next shard's isend / irecv are posted *before* the
current shard is computed, so the transfer runs while the kernel does; the
wait after the kernel is only what the compute did not hide.  Without it the
transfer starts after the kernel, and every step pays compute + transfer.

K and V travel as one flat buffer (one message per step, not two).  The
course's kernels run on host arrays, so on a GPU each step copies the shard
to the host for the kernel; the transfer itself is device to device (NCCL).
"""
from __future__ import annotations

import time

import numpy as np

from . import sharding
from .shard_attention import attend_shard, empty_partial


def pack(k, v, device):
    """K and V of a shard as one flat tensor on ``device`` (one message)."""
    import torch
    flat = np.concatenate([np.ascontiguousarray(k).ravel(), np.ascontiguousarray(v).ravel()])
    return torch.from_numpy(flat).to(device)


def unpack(buffer, k_shape, v_shape):
    """The (k, v) host arrays a flat buffer holds."""
    flat = buffer.cpu().numpy() if buffer.device.type != "cpu" else buffer.numpy()
    n = int(np.prod(k_shape))
    return flat[:n].reshape(k_shape), flat[n:].reshape(v_shape)


def start_exchange(send, recv, rank, world_size):
    """Post the send of ``send`` to rank + 1 and the receive into ``recv`` from rank - 1."""
    import torch.distributed as dist
    return [dist.isend(send, (rank + 1) % world_size), dist.irecv(recv, (rank - 1) % world_size)]


def ring_attention(q, k, v, layouts, *, causal=False, impl="flash_numpy", overlap=True, device="cpu"):
    """This rank's (out, lse) and its timings, from its shards q, k, v (B, H, n, D) dealt by ``layouts``.

    Timings: per step, seconds computing and seconds waiting for the next
    shard after the compute (the exposed communication), and the wall time.
    """
    import torch.distributed as dist
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = empty_partial(q, v.shape[3])
    current = pack(k, v, device)
    incoming = current.clone()
    compute_s, wait_s = [], []
    start = time.perf_counter()
    for step in range(world_size):
        last = step == world_size - 1
        requests = start_exchange(current, incoming, rank, world_size) if overlap and not last else []
        t0 = time.perf_counter()
        src = sharding.ring_source(rank, step, world_size)
        k_src, v_src = unpack(current, k.shape, v.shape)
        state = attend_shard(state, q, layouts[rank], k_src, v_src, layouts[src], causal=causal, impl=impl)
        t1 = time.perf_counter()
        if not overlap and not last:
            requests = start_exchange(current, incoming, rank, world_size)
        for request in requests:
            request.wait()
        compute_s.append(t1 - t0)
        wait_s.append(time.perf_counter() - t1)
        current, incoming = incoming, current   # the sent buffer is free: it receives next
    return state, {"compute_s": compute_s, "wait_s": wait_s, "wall_s": time.perf_counter() - start}
