"""The alpha-beta model of communication, for the ring and for the all-to-all over heads.

A message of m bytes costs t(m) = alpha + m / beta: alpha is the latency (the
fixed cost of any message, however small), beta the bandwidth.  Both are
measured on the machine at hand with a ping-pong (``ping_pong``: rank 0 sends m
bytes, rank 1 sends them back, half the round trip is one message) and fitted
by least squares (``fit_alpha_beta``).

Per rank, for B batches, H query heads, Hk K/V heads, N positions, W ranks:

    ring     W - 1 steps, each one message of the K/V shard:
             B Hk (N/W) (D + Dv) bytes-per-element
    ulysses  4 all-to-alls (q, k, v; then out with lse beside it), each W - 1
             messages; a rank keeps 1/W of what it holds and sends the rest:
             (W-1)/W  B (N/W) (H D + Hk (D + Dv) + H (Dv + 1)) bytes-per-element

So the ring sends about W/2 times the bytes of Ulysses (with H = Hk and
D = Dv) and W - 1 messages to Ulysses' 4 (W - 1): Ulysses wins on bandwidth
once W > 2, the ring on latency, and the ring's transfer can hide under its
compute (``exposed``), Ulysses' cannot (the attention needs all of it first).
Ulysses also needs H and Hk divisible by W.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..core.hardware import DATASHEET, ILLUSTRATIVE, Figure

ULYSSES_COLLECTIVES = 4   # q, k, v in; out (with lse) back

# What changes on NVLink: figures published by NVIDIA (bandwidth) or typical of the class (latency).
NVLINK_H200_BANDWIDTH = Figure(900e9, "B/s", "NVIDIA H200 Tensor Core GPU datasheet, SXM: NVLink 900 GB/s "
                               "per GPU (both directions together; 450 GB/s each way)", DATASHEET)
NVLINK_ONE_WAY = Figure(450e9, "B/s", "half of the H200 datasheet's 900 GB/s NVLink: one direction", DATASHEET)
NVLINK_LATENCY = Figure(5e-6, "s", "a few microseconds per NCCL message between GPUs of one NVLink host "
                        "(class-typical; measure it with this module's ping-pong on the host)", ILLUSTRATIVE)


def ring_bytes_per_step(*, batch, heads, heads_k, seqlen, head_dim, world_size, itemsize, head_dim_v=None):
    """Bytes one rank sends at one ring step: its current K/V shard."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return batch * heads_k * (seqlen // world_size) * (head_dim + dv) * itemsize


def ring_bytes(*, world_size, **shape):
    """Bytes one rank sends over the whole ring: W - 1 shards."""
    return (world_size - 1) * ring_bytes_per_step(world_size=world_size, **shape)


def ulysses_bytes(*, batch, heads, heads_k, seqlen, head_dim, world_size, itemsize, head_dim_v=None):
    """Bytes one rank sends in the four all-to-alls: all it holds of q, k, v, out and lse but its own 1/W.

    out and lse travel in the accumulation dtype (float32, or float64 for float64 inputs)."""
    dv = head_dim if head_dim_v is None else head_dim_v
    n = seqlen // world_size
    acc = max(itemsize, 4)
    held = batch * n * ((heads * head_dim + heads_k * (head_dim + dv)) * itemsize + heads * (dv + 1) * acc)
    return held * (world_size - 1) // world_size


def messages(strategy, world_size):
    """Messages one rank sends: W - 1 ring steps, or W - 1 per all-to-all."""
    return (world_size - 1) * (1 if strategy == "ring" else ULYSSES_COLLECTIVES)


def predict(strategy, alpha, beta, **shape):
    """Predicted communication seconds of one rank, nothing overlapped: alpha per message + bytes / beta."""
    sent = ring_bytes(**shape) if strategy == "ring" else ulysses_bytes(**shape)
    return messages(strategy, shape["world_size"]) * alpha + sent / beta


def hybrid_bytes(*, ulysses_ranks, ring_ranks, batch, heads, heads_k, seqlen, head_dim, itemsize):
    """Bytes one rank sends when Ulysses runs inside groups of ``ulysses_ranks`` and a ring across
    ``ring_ranks`` such groups (W = their product): each group holds N / ring_ranks positions; after
    its all-to-all a rank has them for H / u heads, and its ring moves those heads' K/V shards.
    Out travels back in the input dtype here (lse left out: it is small beside out)."""
    u, r = ulysses_ranks, ring_ranks
    n = seqlen // (u * r)
    swap = (u - 1) * batch * n * (2 * heads * head_dim + 2 * heads_k * head_dim) * itemsize // u
    ring = (r - 1) * batch * (heads_k // u) * (seqlen // r) * 2 * head_dim * itemsize
    return swap + ring


def hybrid_messages(ulysses_ranks, ring_ranks):
    return ULYSSES_COLLECTIVES * (ulysses_ranks - 1) + (ring_ranks - 1)


def hybrid_time(alpha, beta, **shape):
    """alpha per message + bytes / beta, for the hybrid of ``hybrid_bytes``."""
    return (hybrid_messages(shape["ulysses_ranks"], shape["ring_ranks"]) * alpha
            + hybrid_bytes(**shape) / beta)


def exposed(compute_s, transfer_s):
    """Communication a ring with overlap still waits for: per step, the transfer the compute did not hide."""
    return float(np.sum(np.maximum(0.0, np.asarray(transfer_s) - np.asarray(compute_s))))


def fit_alpha_beta(sizes, times):
    """Least-squares (alpha seconds, beta bytes/s) of t = alpha + m / beta over ping-pong sizes m."""
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    slope, intercept = np.polyfit(sizes, times, 1, w=1.0 / times)   # relative error: small messages count
    return float(intercept), float(1.0 / slope)


def ping_pong(rank, world_size, device, sizes, repeats):
    """One-way seconds of a message of each size between ranks 0 and 1: (min, median, max) each.

    Rank 0 sends, rank 1 sends it back; half the round trip is one message.
    Runs on every rank of a group (ranks above 1 wait at the barrier).
    """
    import torch
    import torch.distributed as dist
    out = []
    for size in sizes:
        buffer = torch.zeros(max(1, int(size) // 4), dtype=torch.float32, device=device)
        dist.barrier()
        times = []
        for i in range(repeats + 1):   # the first round trip warms the connection up
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            elif rank == 1:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
            if i:
                times.append((time.perf_counter() - start) / 2)
        if rank == 0:
            out.append((min(times), statistics.median(times), max(times)))
    return out


def comm_pattern(rank, world_size, device, strategy, shape, repeats):
    """Seconds of one strategy's communication alone, each of ``repeats`` rounds (after a warm-up):
    the ring's W - 1 exchanges of a K/V shard, or Ulysses' four all-to-alls, with no attention
    between them, so that neither compute nor one rank's lateness is counted.  ``shape``: the
    keyword arguments of ``ring_bytes_per_step`` (without world_size)."""
    import torch
    import torch.distributed as dist
    elements = lambda nbytes: max(1, int(nbytes) // 4)   # float32 buffers of the right byte size
    if strategy == "ring":
        nbytes = ring_bytes_per_step(world_size=world_size, **shape)
        send, recv = (torch.zeros(elements(nbytes), device=device) for _ in range(2))
    else:
        held = ulysses_bytes(world_size=world_size, **shape) * world_size // max(1, world_size - 1)
        per_call = elements(held / ULYSSES_COLLECTIVES / world_size) * world_size
        send, recv = (torch.zeros(per_call, device=device) for _ in range(2))
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        if strategy == "ring":
            for _ in range(world_size - 1):
                requests = [dist.isend(send, (rank + 1) % world_size), dist.irecv(recv, (rank - 1) % world_size)]
                for request in requests:
                    request.wait()
                send, recv = recv, send
        else:
            for _ in range(ULYSSES_COLLECTIVES):
                dist.all_to_all_single(recv, send)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return times
