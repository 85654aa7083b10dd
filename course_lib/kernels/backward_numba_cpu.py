"""Backward impls ``flash_numba_cpu`` and ``flash_numba_cpu_dq_pass``: the tiled backward, compiled.

Chapter 12's compiled kernel: ``backward_numpy``'s FA2 loop order with Numba,
on chapter 08's micro-kernel (``matmul_nt``, C = A B^T, both operands read
along their contiguous axis) and chapter 08's vectorised ``exp_row``.

``prange`` runs over the (batch, head, key tile) work items.  Item j owns
dKj and dVj (in a per-query-head buffer, so GQA heads never share a row; the
host sums each group afterwards), so no two threads write one element of dK
or dV.  dQ is the hard part: every key tile adds to every dQi it sees, so
items of different key tiles would race on dQi.  Two race-free answers, both
registered so that they can be measured against each other:

- ``partials`` (impl ``flash_numba_cpu``): each thread adds into its own copy
  of dQ (``numba.get_thread_id()`` picks it; one copy per thread, O(N) each),
  and the host sums the copies at the end;
- ``second_pass`` (impl ``flash_numba_cpu_dq_pass``): the key-tile pass
  computes only dK and dV; a second prange over (batch, head, query tile)
  recomputes Pij and dSij and accumulates dQi on its own, so each item owns
  its rows of dQ.  It recomputes S and dP twice: 7 tile matmuls instead of 5.

Per tile (Br x Bc), with P recomputed from the stored lse:
S = Qi Kj^T, dP = dOi Vj^T, then element by element the forward's scalar
rules (softcap, ALiBi, the mask of a PARTIAL tile: ``core.rules``), P =
exp(S - lse_i), dS = P (dP - Di) times softcap's slope (``rules.softcap_slope``);
then dVj += P^T dOi, dKj += scale dS^T Qi, dQi += scale dS Kj.  D = rowsum(dO
* O) is computed on the host first (FA2's first pass).  Which tiles to skip is
the host's plan (``launch.prepare``), as in the forward.  Precision follows
``rules``: float32 accumulation (float64 for float64), P and dS rounded to the
input dtype before their matmuls at float16 / bfloat16.
"""
from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ..core import rules
from ..core.reference_backward import delta, sum_groups
from . import launch as host
from .flash_numba_cpu import FASTMATH

DQ_MODES = ("partials", "second_pass")


def available() -> bool:
    return numba is not None


def _pad(n, to):
    return (n + to - 1) // to * to


if numba is not None:
    from .flash_numba_cpu import alibi_distance, exp_row, matmul_nt, round_to_bits, shift_of, softcap, visible

    softcap_slope = numba.njit(cache=True)(rules.softcap_slope)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def recompute_tile(S, dP, G, lse, Dsum, b, h, r0, n_r, c0, n_c, kind, scale, cap, alibi, slope,
                       offset, left, right, round_bits, round_min_exponent, fast_exp, exponent_bits):
        """S -> P = exp(S - lse_i) and dP -> dS = P (dP - Di) slope, in place, for one tile.

        S holds Qi Kj^T and dP holds dOi Vj^T on entry (rows [0, n_r), keys [0, n_c))."""
        dtype = S.dtype.type
        for r in range(n_r):
            i = r0 + r
            for c in range(n_c):
                j = c0 + c
                t = softcap(S[r, c] * scale, cap)
                if cap > 0:
                    G[r, c] = softcap_slope(t, cap)
                s = t
                if alibi:
                    s -= dtype(slope * alibi_distance(i, j, offset))
                if kind == rules.PARTIAL and not visible(i, j, offset, left, right):
                    s = -np.inf
                S[r, c] = s
            shift = dtype(shift_of(lse[b, h, i]))   # a row that sees no key: every s is -inf, P = 0
            P = S[r]
            if fast_exp:
                exp_row(P, n_c, shift, exponent_bits)
            else:
                for c in range(n_c):
                    P[c] = math.exp(P[c] - shift)
            Di = Dsum[b, h, i]
            for c in range(n_c):
                ds = P[c] * (dP[r, c] - Di)
                if cap > 0:
                    ds *= G[r, c]
                if round_bits > 0:                  # float16 / bfloat16: as the matrix unit takes them
                    P[c] = dtype(round_to_bits(P[c], round_bits, round_min_exponent))
                    ds = dtype(round_to_bits(ds, round_bits, round_min_exponent))
                dP[r, c] = ds

    @numba.njit(cache=True, fastmath=FASTMATH)
    def key_tile(q, k, v, dout, lse, Dsum, b, h, kh, c0, tiles_col, Br, Bc, scale, cap, alibi, slope,
                 offset, left, right, round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv):
        """One work item: dKj, dVj of key rows [c0, c0 + Bc) of (b, h) and, ``with_dq``, its share of dQ."""
        Nq, D, Nk, Dv = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
        dtype = q.dtype.type
        n_c = min(c0 + Bc, Nk) - c0
        Br4, Bc4, D4, Dv4 = (Br + 3) // 4 * 4, (Bc + 3) // 4 * 4, (D + 3) // 4 * 4, (Dv + 3) // 4 * 4
        c4, D2, Dv2 = (n_c + 3) // 4 * 4, (D + 1) // 2 * 2, (Dv + 1) // 2 * 2
        # The tile buffers ("SRAM"), zero so that pads stay finite.
        Kj = np.zeros((Bc4, D4), q.dtype)
        KjT = np.zeros((D4, Bc4), q.dtype)
        Vj = np.zeros((Bc4, Dv4), q.dtype)
        Qi = np.zeros((Br4, D4), q.dtype)
        QiT = np.zeros((D4, Br4), q.dtype)
        dOi = np.zeros((Br4, Dv4), q.dtype)
        dOiT = np.zeros((Dv4, Br4), q.dtype)
        S = np.zeros((Br4, Bc4), q.dtype)       # scores, then P
        dP = np.zeros((Br4, Bc4), q.dtype)      # dP, then dS
        G = np.ones((Br4, Bc4), q.dtype)        # softcap's slope
        PT = np.zeros((Bc4, Br4), q.dtype)
        dST = np.zeros((Bc4, Br4), q.dtype)
        tmp_kv = np.zeros((Bc4, max(D4, Dv4)), q.dtype)
        tmp_q = np.zeros((Br4, D4), q.dtype)
        dKj = np.zeros((n_c, D), q.dtype)       # on chip for the whole inner loop
        dVj = np.zeros((n_c, Dv), q.dtype)
        exponent_bits = np.zeros(Bc4, np.int32)
        tid = numba.get_thread_id()
        for c in range(n_c):
            for d in range(D):
                Kj[c, d] = k[b, kh, c0 + c, d]
                KjT[d, c] = k[b, kh, c0 + c, d]
            for e in range(Dv):
                Vj[c, e] = v[b, kh, c0 + c, e]
        for tr in range(tiles_col.shape[0]):      # inner: the query tiles that see this key tile
            kind = tiles_col[tr]
            if kind == rules.EMPTY:
                continue
            r0 = tr * Br
            n_r = min(r0 + Br, Nq) - r0
            r4 = (n_r + 3) // 4 * 4
            for r in range(n_r):
                for d in range(D):
                    Qi[r, d] = q[b, h, r0 + r, d]
                    QiT[d, r] = q[b, h, r0 + r, d]
                for e in range(Dv):
                    dOi[r, e] = dout[b, h, r0 + r, e]
                    dOiT[e, r] = dout[b, h, r0 + r, e]
            matmul_nt(Qi, Kj, S, r4, (n_c + 1) // 2 * 2, D)        # S = Qi Kj^T
            matmul_nt(dOi, Vj, dP, r4, (n_c + 1) // 2 * 2, Dv)     # dP = dOi Vj^T
            recompute_tile(S, dP, G, lse, Dsum, b, h, r0, n_r, c0, n_c, kind, scale, cap, alibi, slope,
                           offset, left, right, round_bits, round_min_exponent, fast_exp, exponent_bits)
            for r in range(n_r):
                for c in range(n_c):
                    PT[c, r] = S[r, c]
                    dST[c, r] = dP[r, c]
            matmul_nt(PT, dOiT, tmp_kv, c4, Dv2, n_r)             # dVj += Pij^T dOi
            for c in range(n_c):
                for e in range(Dv):
                    dVj[c, e] += tmp_kv[c, e]
            matmul_nt(dST, QiT, tmp_kv, c4, D2, n_r)               # dKj += scale dSij^T Qi
            for c in range(n_c):
                for d in range(D):
                    dKj[c, d] += scale * tmp_kv[c, d]
            if with_dq:                                            # this thread's copy of dQi += scale dSij Kj
                matmul_nt(dP, KjT, tmp_q, r4, D2, n_c)
                for r in range(n_r):
                    for d in range(D):
                        dq[tid, b, h, r0 + r, d] += scale * tmp_q[r, d]
        for c in range(n_c):                      # dKj, dVj written once
            for d in range(D):
                dk[b, h, c0 + c, d] = dKj[c, d]
            for e in range(Dv):
                dv[b, h, c0 + c, e] = dVj[c, e]

    @numba.njit(cache=True, fastmath=FASTMATH)
    def query_tile(q, k, v, dout, lse, Dsum, b, h, kh, r0, tiles_row, Br, Bc, scale, cap, alibi, slope,
                   offset, left, right, round_bits, round_min_exponent, fast_exp, dq):
        """The second pass: dQi of query rows [r0, r0 + Br) of (b, h), recomputing Pij and dSij."""
        Nq, D, Nk, Dv = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
        n_r = min(r0 + Br, Nq) - r0
        Br4, Bc4, D4, Dv4 = (Br + 3) // 4 * 4, (Bc + 3) // 4 * 4, (D + 3) // 4 * 4, (Dv + 3) // 4 * 4
        r4, D2 = (n_r + 3) // 4 * 4, (D + 1) // 2 * 2
        Qi = np.zeros((Br4, D4), q.dtype)
        dOi = np.zeros((Br4, Dv4), q.dtype)
        Kj = np.zeros((Bc4, D4), q.dtype)
        KjT = np.zeros((D4, Bc4), q.dtype)
        Vj = np.zeros((Bc4, Dv4), q.dtype)
        S = np.zeros((Br4, Bc4), q.dtype)
        dP = np.zeros((Br4, Bc4), q.dtype)
        G = np.ones((Br4, Bc4), q.dtype)
        tmp_q = np.zeros((Br4, D4), q.dtype)
        dQi = np.zeros((n_r, D), q.dtype)
        exponent_bits = np.zeros(Bc4, np.int32)
        for r in range(n_r):
            for d in range(D):
                Qi[r, d] = q[b, h, r0 + r, d]
            for e in range(Dv):
                dOi[r, e] = dout[b, h, r0 + r, e]
        for tc in range(tiles_row.shape[0]):
            kind = tiles_row[tc]
            if kind == rules.EMPTY:
                continue
            c0 = tc * Bc
            n_c = min(c0 + Bc, Nk) - c0
            for c in range(n_c):
                for d in range(D):
                    Kj[c, d] = k[b, kh, c0 + c, d]
                    KjT[d, c] = k[b, kh, c0 + c, d]
                for e in range(Dv):
                    Vj[c, e] = v[b, kh, c0 + c, e]
            matmul_nt(Qi, Kj, S, r4, (n_c + 1) // 2 * 2, D)
            matmul_nt(dOi, Vj, dP, r4, (n_c + 1) // 2 * 2, Dv)
            recompute_tile(S, dP, G, lse, Dsum, b, h, r0, n_r, c0, n_c, kind, scale, cap, alibi, slope,
                           offset, left, right, round_bits, round_min_exponent, fast_exp, exponent_bits)
            matmul_nt(dP, KjT, tmp_q, r4, D2, n_c)
            for r in range(n_r):
                for d in range(D):
                    dQi[r, d] += scale * tmp_q[r, d]
        for r in range(n_r):
            for d in range(D):
                dq[b, h, r0 + r, d] = dQi[r, d]

    @numba.njit(cache=True, parallel=True)
    def key_pass(q, k, v, dout, lse, Dsum, tiles, kv_head, Br, Bc, scale, cap, alibi, slopes, offset, left,
                 right, round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv):
        """Every (batch, head, key tile) item over the cores, in zigzag order (a causal mask
        makes early key tiles heavy: every later query sees them)."""
        B, H = q.shape[0], q.shape[1]
        Tc = tiles.shape[1]
        for item in numba.prange(B * H * Tc):
            bh, z = item // Tc, item % Tc
            b, h = bh // H, bh % H
            t = z // 2 if z % 2 == 0 else Tc - 1 - z // 2
            key_tile(q, k, v, dout, lse, Dsum, b, h, kv_head[h], t * Bc, tiles[:, t], Br, Bc,
                     q.dtype.type(scale), q.dtype.type(cap), alibi, slopes[b, h], offset, left, right,
                     round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv)

    @numba.njit(cache=True, parallel=True)
    def query_pass(q, k, v, dout, lse, Dsum, tiles, kv_head, Br, Bc, scale, cap, alibi, slopes, offset, left,
                   right, round_bits, round_min_exponent, fast_exp, dq):
        """Every (batch, head, query tile) item: each owns its rows of dQ."""
        B, H = q.shape[0], q.shape[1]
        Tr = tiles.shape[0]
        for item in numba.prange(B * H * Tr):
            bh, z = item // Tr, item % Tr
            b, h = bh // H, bh % H
            t = z // 2 if z % 2 == 0 else Tr - 1 - z // 2
            query_tile(q, k, v, dout, lse, Dsum, b, h, kv_head[h], t * Br, tiles[t], Br, Bc,
                       q.dtype.type(scale), q.dtype.type(cap), alibi, slopes[b, h], offset, left, right,
                       round_bits, round_min_exponent, fast_exp, dq)


    @numba.njit(cache=True, fastmath=FASTMATH)
    def recompute_only_tile(q, k, lse, Dsum, b, h, kh, c0, tiles_col, Br, Bc, scale, cap, alibi, slope,
                            offset, left, right, round_bits, round_min_exponent, fast_exp):
        """What the backward pays for not storing P, alone: Sij = Qi Kj^T and Pij = exp(Sij - lse_i)
        for every query tile that sees key tile j (``key_tile`` minus its gradient matmuls).
        Returns the sum of P, so that the compiler keeps the work."""
        Nq, D, Nk = q.shape[2], q.shape[3], k.shape[2]
        n_c = min(c0 + Bc, Nk) - c0
        Br4, Bc4, D4 = (Br + 3) // 4 * 4, (Bc + 3) // 4 * 4, (D + 3) // 4 * 4
        Kj = np.zeros((Bc4, D4), q.dtype)
        Qi = np.zeros((Br4, D4), q.dtype)
        S = np.zeros((Br4, Bc4), q.dtype)
        dP = np.zeros((Br4, Bc4), q.dtype)      # stays 0: dS is not wanted here
        G = np.ones((Br4, Bc4), q.dtype)
        exponent_bits = np.zeros(Bc4, np.int32)
        total = 0.0
        for c in range(n_c):
            for d in range(D):
                Kj[c, d] = k[b, kh, c0 + c, d]
        for tr in range(tiles_col.shape[0]):
            kind = tiles_col[tr]
            if kind == rules.EMPTY:
                continue
            r0 = tr * Br
            n_r = min(r0 + Br, Nq) - r0
            for r in range(n_r):
                for d in range(D):
                    Qi[r, d] = q[b, h, r0 + r, d]
            matmul_nt(Qi, Kj, S, (n_r + 3) // 4 * 4, (n_c + 1) // 2 * 2, D)
            recompute_tile(S, dP, G, lse, Dsum, b, h, r0, n_r, c0, n_c, kind, scale, cap, alibi, slope,
                           offset, left, right, round_bits, round_min_exponent, fast_exp, exponent_bits)
            for r in range(n_r):
                for c in range(n_c):
                    total += S[r, c]
        return total

    @numba.njit(cache=True, parallel=True)
    def recompute_pass(q, k, lse, Dsum, tiles, kv_head, Br, Bc, scale, cap, alibi, slopes, offset, left,
                       right, round_bits, round_min_exponent, fast_exp, totals):
        """``key_pass``'s items, recomputing P only (the benchmark's measure of the recompute's share)."""
        B, H = q.shape[0], q.shape[1]
        Tc = tiles.shape[1]
        for item in numba.prange(B * H * Tc):
            bh, z = item // Tc, item % Tc
            b, h = bh // H, bh % H
            t = z // 2 if z % 2 == 0 else Tc - 1 - z // 2
            totals[item] = recompute_only_tile(q, k, lse, Dsum, b, h, kv_head[h], t * Bc, tiles[:, t], Br, Bc,
                                               q.dtype.type(scale), q.dtype.type(cap), alibi, slopes[b, h],
                                               offset, left, right, round_bits, round_min_exponent, fast_exp)


def recompute_only(q, k, v, out, lse, dout, opts, mask):
    """Run only the recompute of P (``recompute_pass``) for validated inputs; returns the sum of P
    (the number of query rows that see a key, up to rounding: each row of P sums to 1)."""
    launch, qc, kc, _ = host.prepare(q, k, v, opts, mask, *host.DEFAULT_TILES["flash_numba_cpu"])
    acc = launch.acc_dtype
    lse = np.ascontiguousarray(lse, dtype=acc)
    Dsum = np.zeros(lse.shape, dtype=acc)
    totals = np.zeros(q.shape[0] * q.shape[1] * launch.tiles.shape[1])
    recompute_pass(qc, kc, lse, Dsum, launch.tiles, launch.kv_head, launch.Br, launch.Bc, launch.softmax_scale,
                   launch.softcap, launch.alibi, launch.slopes, launch.offset, launch.left, launch.right,
                   launch.round_bits, launch.round_min_exponent, acc == np.float32, totals)
    return float(totals.sum())


def run_kernels(launch, q, k, v, out, lse, dout, dq_mode="partials"):
    """(dq, dk per query head, dv per query head) in the accumulation dtype, from prepared q, k, v."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq must be one of {DQ_MODES}, got {dq_mode!r}")
    acc = launch.acc_dtype
    dout, out = (np.ascontiguousarray(x, dtype=acc) for x in (dout, out))
    lse = np.ascontiguousarray(lse, dtype=acc)
    Dsum = np.ascontiguousarray(delta(dout, out, acc))                 # pass 1: D = rowsum(dO * O)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    dk = np.empty((B, H, Nk, D), dtype=acc)
    dv = np.empty((B, H, Nk, Dv), dtype=acc)
    partials = dq_mode == "partials"
    dq_parts = np.zeros((numba.config.NUMBA_NUM_THREADS if partials else 1, B, H, Nq, D), dtype=acc)
    common = (launch.tiles, launch.kv_head, launch.Br, launch.Bc, launch.softmax_scale, launch.softcap,
              launch.alibi, launch.slopes, launch.offset, launch.left, launch.right, launch.round_bits,
              launch.round_min_exponent, acc == np.float32)
    try:
        key_pass(q, k, v, dout, lse, Dsum, *common, partials, dq_parts, dk, dv)
        if partials:
            dq = dq_parts.sum(axis=0)                                 # merge the threads' copies
        else:
            dq = np.empty((B, H, Nq, D), dtype=acc)
            query_pass(q, k, v, dout, lse, Dsum, *common, dq)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu's backward failed to compile for {q.dtype} inputs: {error}") from error
    return dq, dk, dv


def attention_backward(q, k, v, out, lse, dout, opts, mask, dq="partials"):
    """The compiled backward for validated dense inputs: (dq, dk, dv) in q's dtype."""
    launch, qc, kc, vc = host.prepare(q, k, v, opts, mask, *host.DEFAULT_TILES["flash_numba_cpu"])
    dq_, dk, dv = run_kernels(launch, qc, kc, vc, out, lse, dout, dq)
    Hk = k.shape[1]
    if Hk != q.shape[1]:
        dk, dv = sum_groups(dk, Hk), sum_groups(dv, Hk)
    return tuple(g.astype(q.dtype, copy=False) for g in (dq_, dk, dv))
