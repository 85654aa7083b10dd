"""The backward's HBM traffic, counted and modelled (chapter 12), as chapter 03 counts the forward.

``run_counted_backward(q, k, v, out, lse, dout, schedule=...)`` runs a backward
for real on ``kernels.counted``'s memory (every load and store counted per
tensor, every on-chip buffer in an ``SRAM`` with its peak), one (batch, head)
at a time as one thread block sees it:

``fa2``    ``kernels.backward_numpy``'s FA2 order: D in a first pass, K/V tiles outer, dQ in HBM;
``fa1``    the same loops with D recomputed from O in every inner step;
``naive``  what autograd does through chapter 01's attention: P was stored by the
           forward, dP and dS are written to HBM and read back.

``backward_io(...)`` is the model of the same bytes, written from the loops
(tests hold the two equal on shapes, tails and masks).  Tensor names:
Q, K, V, O, dO, lse, D (rowsum(dO * O), float32), dQ (the float32
accumulator), dQ out (dQ in q's dtype), dK, dV, and for ``naive`` P, dP, dS.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..core import rules
from ..core.backward_options import call_backward
from ..core.masks import MaskSpec
from ..core.reference_backward import backward_math
from ..kernels.backward_numpy import flash_backward
from ..kernels.counted import SRAM, Chip, Traffic, traffic, traffic_of
from ..kernels.flash_numpy import TileStats
from ..kernels.launch import DEFAULT_TILES

SCHEDULES = ("naive", "fa1", "fa2")


@dataclass
class CountedBackward:
    """What ``run_counted_backward`` computed and moved."""

    grads: tuple            # (dq, dk, dv)
    traffic: Traffic
    sram_peak: int          # bytes
    sram_peak_buffers: dict


def _naive(q, k, v, out, lse, dout, opts, mask, mem, stats):
    """One head: P read from HBM (the forward stored it), dP and dS through HBM, then the matmuls."""
    every = np.s_[...]
    acc = rules.acc_dtype(q.dtype)
    Nq, Nk, D, Dv = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    dq, dk, dv = backward_math(q, k, v, out, lse, dout, opts, mask, acc)   # the values; the moves below
    P = np.zeros((1, 1, Nq, Nk), q.dtype)           # what the forward left in HBM
    dP, dS = np.empty_like(P), np.empty_like(P)
    mem.load("P", P, every), mem.load("dO", dout, every)              # dV = P^T dO
    mem.load("dO", dout, every), mem.load("V", v, every)              # dP = dO V^T
    mem.store("dP", dP, every, 0)
    mem.load("P", P, every), mem.load("dP", dP, every)                # dS = P * (dP - rowsum(P * dP))
    mem.store("dS", dS, every, 0)
    mem.load("dS", dS, every), mem.load("K", k, every)                # dQ = scale dS K
    mem.load("dS", dS, every), mem.load("Q", q, every)                # dK = scale dS^T Q
    for name, array, grad in (("dQ out", np.empty_like(q), dq), ("dK", np.empty_like(k), dk),
                              ("dV", np.empty_like(v), dv)):
        mem.store(name, array, every, grad)
    stats.flops += 2 * Nq * Nk * (2 * D + 2 * Dv)     # no recompute: dV, dP, dQ, dK
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


def run_counted_backward(q, k, v, out, lse, dout, *, schedule="fa2", block_q=None, block_k=None,
                         sram_capacity=None, **options) -> CountedBackward:
    """Run ``schedule`` on real inputs, counting every HBM byte and the SRAM peak.

    Arguments as ``course_lib.attention_backward``'s (validated the same way); tiles
    ``block_q`` x ``block_k``, by default flash_numpy's.  The gradients match the reference;
    ``traffic`` equals ``backward_io`` with the same shape, dtype, tiles and mask."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    stats, sram = TileStats(), SRAM(sram_capacity)
    chip = Chip(stats, sram)

    def backward(q, k, v, out, lse, dout, opts, mask):
        B, H = q.shape[:2]
        group = H // k.shape[1]
        dq, dk, dv = np.zeros_like(q), np.zeros(k.shape, np.float64), np.zeros(v.shape, np.float64)
        for b in range(B):                      # one (batch, head) at a time: one thread block's view
            for h in range(H):
                one, kv = np.s_[b:b + 1, h:h + 1], np.s_[b:b + 1, h // group:h // group + 1]
                head_opts = opts if opts.alibi_slopes is None else replace(opts, alibi_slopes=opts.alibi_slopes[one])
                args = (q[one], k[kv], v[kv], out[one], lse[one], dout[one], head_opts, mask)
                if schedule == "naive":
                    g = _naive(*args, chip, stats)
                else:
                    g = flash_backward(*args, loop_order=schedule, stats=stats, mem=chip)
                dq[one] = g[0]
                dk[kv] += g[1]                  # the group's sum (a GPU adds it into dK in HBM)
                dv[kv] += g[2]
        return dq, dk.astype(q.dtype), dv.astype(q.dtype)

    grads = call_backward(backward, q, k, v, out, lse, dout, block_q=block_q, block_k=block_k, **options)
    return CountedBackward(grads, traffic_of(f"backward {schedule}", stats), sram.peak, sram.peak_buffers)


def backward_io(batch, heads, seqlen_q, seqlen_k, head_dim, head_dim_v=None, *, dtype="float32",
                schedule="fa2", block_q=None, block_k=None, lse_dtype=None, causal=False,
                causal_align="bottom_right", window_size=(-1, -1)) -> Traffic:
    """The bytes ``run_counted_backward`` moves, from the loops' structure alone.

    Per (batch, head): e = itemsize of ``dtype``, a = the accumulation dtype's, l = lse's.
    fa2: pass 1 reads O and dO, writes D; dQ (float32) is zeroed; per key tile with any visible
    tile, Kj and Vj are read; per visible tile (i, j), Qi, dOi, lse_i, Di are read and dQi read and
    written; dKj and dVj are written once per key tile; a last pass reads dQ and writes dQ out.
    fa1: no pass 1; each visible tile reads Oi instead of Di.  naive: P read twice, dP and dS
    written once and read (dP once, dS twice), Q, K, V, dO read, dQ, dK, dV written."""
    Dv = head_dim if head_dim_v is None else head_dim_v
    D, Nq, Nk = head_dim, seqlen_q, seqlen_k
    e, a = rules.itemsize(dtype), rules.acc_dtype(dtype).itemsize
    lsz = np.dtype(rules.lse_dtype(dtype) if lse_dtype is None else lse_dtype).itemsize
    per_head = batch * heads
    reads, writes = {}, {}

    def add(table, name, n):
        table[name] = table.get(name, 0) + per_head * n

    if schedule == "naive":
        for name, n in (("P", 2 * Nq * Nk * e), ("dP", Nq * Nk * e), ("dS", 2 * Nq * Nk * e),
                        ("dO", 2 * Nq * Dv * e), ("V", Nk * Dv * e), ("K", Nk * D * e), ("Q", Nq * D * e)):
            add(reads, name, n)
        for name, n in (("dP", Nq * Nk * e), ("dS", Nq * Nk * e), ("dQ out", Nq * D * e), ("dK", Nk * D * e),
                        ("dV", Nk * Dv * e)):
            add(writes, name, n)
        return traffic("backward naive", per_head * 2 * Nq * Nk * (2 * D + 2 * Dv), 0, reads, writes)
    Br, Bc = block_q or DEFAULT_TILES["flash_numpy"][0], block_k or DEFAULT_TILES["flash_numpy"][1]
    mask = MaskSpec(Nq, Nk, causal, causal_align, tuple(window_size))
    codes = mask.tile_codes(Br, Bc)                   # (Tr, Tc)
    rows = np.minimum(np.arange(codes.shape[0]) * Br + Br, Nq) - np.arange(codes.shape[0]) * Br
    cols = np.minimum(np.arange(codes.shape[1]) * Bc + Bc, Nk) - np.arange(codes.shape[1]) * Bc
    seen = codes != rules.EMPTY
    visible_rows = int((seen * rows[:, None]).sum())          # sum over visible tiles of their rows
    visible_pairs = int((seen * np.outer(rows, cols)).sum())
    live_cols = int(cols[seen.any(axis=0)].sum())            # keys of key tiles some query sees
    if schedule == "fa2":
        add(reads, "O", Nq * Dv * e), add(reads, "dO", Nq * Dv * e), add(writes, "D", Nq * a)
        add(reads, "D", visible_rows * a)
    else:
        add(reads, "O", visible_rows * Dv * e)
    add(writes, "dQ", Nq * D * a + visible_rows * D * a)
    add(reads, "dQ", visible_rows * D * a + Nq * D * a)
    add(reads, "K", live_cols * D * e), add(reads, "V", live_cols * Dv * e)
    add(reads, "Q", visible_rows * D * e), add(reads, "dO", visible_rows * Dv * e)
    add(reads, "lse", visible_rows * lsz)
    add(writes, "dK", Nk * D * e), add(writes, "dV", Nk * Dv * e), add(writes, "dQ out", Nq * D * e)
    flops = per_head * 2 * visible_pairs * (3 * D + 2 * Dv)
    return traffic(f"backward {schedule}", flops, per_head * visible_pairs, reads, writes)
