"""Backward impl ``flash_numba_cuda``: chapter 12's tiled backward as two Numba CUDA kernels, float32 SIMT.

The algorithm is ``backward_numpy``'s (FA2's backward, P recomputed from the
stored lse, D_i = rowsum(dO_i * O_i) computed once on the host); what changes
is who runs it, as chapter 09 did for the forward:

- ``dkdv_kernel``: one block per (key tile, batch x K / V head), one thread
  per key row j.  Thread j keeps k_j, v_j and its accumulators dk_j, dv_j for
  the whole kernel; the block loads each query tile (Q_i, dO_i, lse_i, D_i) of
  every query head that reads this K / V head (GQA / MQA: the sum over the
  group happens here, in the accumulators) into shared memory, and each
  thread walks its rows: s, p = exp(s - lse), dv += p dO_i, dp = dO_i . v_j,
  ds = p (dp - D_i) (times softcap's slope), dk += scale ds q_i.
- ``dq_kernel``: one block per (query tile, batch x head), one thread per
  query row i, the same recomputation over the key tiles it visits:
  dq += scale ds k_j.  Recomputing S a second time is FA2's price for dQ
  without atomics (chapter 12 measures the per-thread-partials way on the CPU).

EMPTY tiles are skipped by the whole block (every thread reads the same plan
entry); the mask is applied element by element on PARTIAL and tail tiles, by
``core.rules``' scalar rules compiled for the GPU.  A row that saw no key
(lse = -inf) has P = 0 and a zero gradient.  Float32 only, like chapter 09's
forward.  It runs on a GPU, or in numba's simulator (``NUMBA_ENABLE_CUDASIM=1``,
small shapes); its times beside PyTorch's SDPA backward are
``benchmarks/gpu_backward.py``'s.
"""
from __future__ import annotations

import math

import numpy as np

try:
    import numba
    from numba import cuda, float32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the impl is unavailable
    numba = None

from ..core import rules
from ..core.reference import rebased_lse
from ..core.reference_backward import delta
from . import flash_numba_cuda as ch09
from . import launch as host

TILE = 32          # query rows / keys per tile, and threads per block (one warp)

if numba is not None:
    softcap_slope = cuda.jit(device=True)(rules.softcap_slope)


def available() -> bool:
    """On a GPU, or in numba's simulator (set NUMBA_ENABLE_CUDASIM=1 before numba is imported)."""
    return numba is not None and (bool(numba.config.ENABLE_CUDASIM) or ch09.on_gpu())


_KERNELS = {}


def make_kernels(D: int, Dv: int):
    """(dkdv_kernel, dq_kernel) for head dims D, Dv (shared and local arrays need their sizes)."""
    if (D, Dv) in _KERNELS:
        return _KERNELS[D, Dv]
    T = TILE
    NEG_INF = float32(-math.inf)
    visible, alibi_rebased_distance, softcap = ch09.visible, ch09.alibi_rebased_distance, ch09.softcap

    @cuda.jit(device=True)
    def grad_pair(qv, kv, dov, vv, lse_i, d_i, i, j, masked, scale, cap, alibi, slope, offset, Nk, left, right):
        """(p, ds) of query row i and key j, recomputed: the forward's score, P from the stored lse (both
        ALiBi-rebased: the host hands the kernels ``core.reference.rebased_lse``)."""
        s = float32(0.0)
        for d in range(D):
            s += qv[d] * kv[d]
        t = float32(softcap(s * scale, cap))
        sc = t
        if alibi:
            sc -= slope * float32(alibi_rebased_distance(i, j, offset, Nk))
        if masked and not visible(i, j, offset, left, right):
            return float32(0.0), float32(0.0)
        shift = lse_i if lse_i != NEG_INF else float32(0.0)     # a row that saw no key: P = 0
        p = math.exp(sc - shift)
        dp = float32(0.0)
        for e in range(Dv):
            dp += dov[e] * vv[e]
        ds = p * (dp - d_i)
        if cap > 0:
            ds *= float32(softcap_slope(t, cap))
        return p, ds

    @cuda.jit
    def dkdv_kernel(q, k, v, dout, lse, dsum, tiles, kv_head_of, group, scale, cap, alibi, slopes,
                    offset, left, right, dk, dv):
        """grid (Tc, B * Hk), TILE threads: dk, dv (B, Hk, Nk, D / Dv), summed over each group."""
        Nq, Nk = q.shape[2], k.shape[2]
        Hk = k.shape[1]
        tc = cuda.blockIdx.x
        b = cuda.blockIdx.y // Hk
        kh = cuda.blockIdx.y % Hk
        t = cuda.threadIdx.x
        j = tc * T + t
        qs = cuda.shared.array((T, D), float32)
        dos = cuda.shared.array((T, Dv), float32)
        ls = cuda.shared.array(T, float32)
        ds_ = cuda.shared.array(T, float32)
        kj = cuda.local.array(D, float32)
        vj = cuda.local.array(Dv, float32)
        dkj = cuda.local.array(D, float32)
        dvj = cuda.local.array(Dv, float32)
        for d in range(D):
            kj[d] = k[b, kh, j, d] if j < Nk else float32(0.0)
            dkj[d] = float32(0.0)
        for e in range(Dv):
            vj[e] = v[b, kh, j, e] if j < Nk else float32(0.0)
            dvj[e] = float32(0.0)
        for g in range(group):
            h = kh * group + g
            slope = float32(slopes[b, h])
            for tr in range(tiles.shape[0]):
                kind = tiles[tr, tc]
                if kind == rules.EMPTY:
                    continue
                cuda.syncthreads()             # nobody reads the last query tile any more
                i = tr * T + t
                for d in range(D):
                    qs[t, d] = q[b, h, i, d] if i < Nq else float32(0.0)
                for e in range(Dv):
                    dos[t, e] = dout[b, h, i, e] if i < Nq else float32(0.0)
                ls[t] = lse[b, h, i] if i < Nq else NEG_INF
                ds_[t] = dsum[b, h, i] if i < Nq else float32(0.0)
                cuda.syncthreads()
                if j < Nk:
                    masked = kind == rules.PARTIAL
                    for r in range(min(T, Nq - tr * T)):
                        p, ds = grad_pair(qs[r], kj, dos[r], vj, ls[r], ds_[r], tr * T + r, j, masked,
                                          scale, cap, alibi, slope, offset, Nk, left, right)
                        for e in range(Dv):
                            dvj[e] += p * dos[r, e]
                        for d in range(D):
                            dkj[d] += scale * ds * qs[r, d]
        if j < Nk:
            for d in range(D):
                dk[b, kh, j, d] = dkj[d]
            for e in range(Dv):
                dv[b, kh, j, e] = dvj[e]

    @cuda.jit
    def dq_kernel(q, k, v, dout, lse, dsum, tiles, kv_head_of, group, scale, cap, alibi, slopes,
                  offset, left, right, dq):
        """grid (Tr, B * H), TILE threads: dq (B, H, Nq, D)."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        tr = cuda.blockIdx.x
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        kh = kv_head_of[h]
        t = cuda.threadIdx.x
        i = tr * T + t
        ks = cuda.shared.array((T, D), float32)
        vs = cuda.shared.array((T, Dv), float32)
        qi = cuda.local.array(D, float32)
        doi = cuda.local.array(Dv, float32)
        dqi = cuda.local.array(D, float32)
        for d in range(D):
            qi[d] = q[b, h, i, d] if i < Nq else float32(0.0)
            dqi[d] = float32(0.0)
        for e in range(Dv):
            doi[e] = dout[b, h, i, e] if i < Nq else float32(0.0)
        lse_i = lse[b, h, i] if i < Nq else NEG_INF
        d_i = dsum[b, h, i] if i < Nq else float32(0.0)
        slope = float32(slopes[b, h])
        for tc in range(tiles.shape[1]):
            kind = tiles[tr, tc]
            if kind == rules.EMPTY:
                continue
            cuda.syncthreads()
            j = tc * T + t
            for d in range(D):
                ks[t, d] = k[b, kh, j, d] if j < Nk else float32(0.0)
            for e in range(Dv):
                vs[t, e] = v[b, kh, j, e] if j < Nk else float32(0.0)
            cuda.syncthreads()
            if i < Nq:
                masked = kind == rules.PARTIAL
                for c in range(min(T, Nk - tc * T)):
                    p, ds = grad_pair(qi, ks[c], doi, vs[c], lse_i, d_i, i, tc * T + c, masked,
                                      scale, cap, alibi, slope, offset, Nk, left, right)
                    for d in range(D):
                        dqi[d] += scale * ds * ks[c, d]
        if i < Nq:
            for d in range(D):
                dq[b, h, i, d] = dqi[d]

    _KERNELS[D, Dv] = (dkdv_kernel, dq_kernel)
    return _KERNELS[D, Dv]


def plan(q, k, v, opts, mask):
    """(dkdv_kernel, dq_kernel, grid of each, the arguments between the tensors and the outputs)."""
    if q.dtype != np.float32:
        raise TypeError(f"the CUDA backward computes in float32 only; q, k and v are {q.dtype}")
    B, H, Nq, D = q.shape
    Hk, Dv = k.shape[1], v.shape[3]
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, TILE, TILE)[0]
    if launch.Br != TILE or launch.Bc != TILE:
        raise ValueError(f"the CUDA backward runs {TILE} x {TILE} tiles (one warp a block); block_q / block_k "
                         f"must be left out or {TILE}, got {launch.Br} x {launch.Bc}")
    dkdv, dq = make_kernels(D, Dv)
    args = (launch.tiles, launch.kv_head.astype(np.int32), H // Hk, np.float32(launch.softmax_scale),
            np.float32(launch.softcap), launch.alibi, launch.slopes.astype(np.float32),
            launch.offset, launch.left, launch.right)
    Tr, Tc = launch.tiles.shape
    return dkdv, dq, (Tc, B * Hk), (Tr, B * H), args


def launcher(q, k, v, out, lse, dout, opts, mask):
    """(a zero-argument callable running both kernels on device arrays, dq, dk, dv on the device): the inputs
    (and D_i, computed here on the host) copied once, so that a timing loop times the kernels alone."""
    dkdv, dq_k, grid_kv, grid_q, args = plan(q, k, v, opts, mask)
    dsum = delta(dout, out, np.float32).astype(np.float32)
    lse = rebased_lse(lse, opts, mask)                              # the kernels' scores are rebased
    ins = tuple(cuda.to_device(np.ascontiguousarray(x, dtype=np.float32)) for x in (q, k, v, dout, lse, dsum))
    dargs = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    dq = cuda.to_device(np.full(q.shape, np.nan, np.float32))       # poisoned: a gradient nobody wrote shows
    dk = cuda.to_device(np.full(k.shape, np.nan, np.float32))
    dv = cuda.to_device(np.full(v.shape, np.nan, np.float32))
    run_kv, run_q = dkdv[grid_kv, TILE], dq_k[grid_q, TILE]

    def go():
        run_kv(*ins, *dargs, dk, dv)
        run_q(*ins, *dargs, dq)
    return go, dq, dk, dv


def attention_backward(q, k, v, out, lse, dout, opts, mask):
    """(dq, dk, dv) float32 for validated dense inputs (an ``attention_backward``)."""
    if not available():
        raise RuntimeError("the CUDA backward runs on a GPU or in numba's simulator (NUMBA_ENABLE_CUDASIM=1)")
    B, H, Nq, D = q.shape
    if not ch09.on_gpu() and B * H * Nq * k.shape[2] * (D + v.shape[3]) > ch09.sim_max_work():
        raise ValueError(f"the simulator takes only small problems (B*H*Nq*Nk*(D+Dv) <= {ch09.sim_max_work()})")
    go, dq, dk, dv = launcher(q, k, v, out, lse, dout, opts, mask)
    go()
    return dq.copy_to_host(), dk.copy_to_host(), dv.copy_to_host()
