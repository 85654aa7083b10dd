"""Steps ``tiled``, ``tiled_unsigned`` and ``tiled_padded``: register micro-tiles.

A block of ``threads`` computes a ``Br x Bc`` tile of S, each thread an
``RM x RN`` piece of it and an ``RM x RE`` piece of O, so one value read from
shared memory feeds RN (or RM) FMAs instead of one.  Q is kept scaled in
shared memory; P goes through shared memory (reusing Ks) to the threads that
own its rows of O.  The K / V tile is loaded at the end of each iteration,
for the next one.

The three steps are this one kernel with different numbers in its Tiling:
``tiled`` indexes shared memory with signed integers (``unsigned=False``),
``tiled_unsigned`` with unsigned ones, ``tiled_padded`` also pads every shared
row by one float (``pad=1``).
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32, int64, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from ...core import rules
from .device import SIMULATOR, alibi_distance, finalize, max_nan, rescale_exp2, shift_of, softcap, visible
from .tiling import Tiling

_KERNELS = {}


def make_tiled_kernel(tiling: Tiling, D: int, Dv: int):
    """The micro-tiled forward kernel for one Tiling and head dims D, Dv (built once, kept)."""
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    L = tiling.layout(D, Dv)
    Br, Bc, NT, TX, TY, RM, RN = tiling.Br, tiling.Bc, tiling.threads, tiling.tx, tiling.ty, tiling.rm, tiling.rn
    QS, KS, PS, VS, RED, DP, EP, BP, RE = (L[n] for n in ("QS", "KS", "PS", "VS", "RED", "DP", "EP", "BP", "RE"))
    U = uint64 if tiling.unsigned else int64   # int64(x) changes nothing: numba's wraparound code stays
    NK = -(-Bc * D // NT)            # K elements each thread loads per tile
    NV = -(-Bc * EP // NT)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)

    caps = {} if SIMULATOR or not tiling.max_regs else {"max_registers": tiling.max_regs}

    @cuda.jit(fastmath=True, **caps)
    def tiled_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                             offset, left, right, out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq): S = gridDim.z splits."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        tr = cuda.blockIdx.x
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % TX
        ty = t // TX
        row0 = tr * Br
        sm = cuda.shared.array(0, float32)
        slope = float32(slopes[b, h])

        # This split's share of the query tile's list of key tiles.
        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)

        for x in range(t, Br * D, NT):        # Q tile, scaled (log2 units), zero past Nq
            r = x // D
            d = x % D
            val = float32(0.0)
            if row0 + r < Nq:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(QS + r * DP + d)] = val

        o = cuda.local.array((RM, RE), float32)
        m = cuda.local.array(RM, float32)
        l = cuda.local.array(RM, float32)
        s = cuda.local.array((RM, RN), float32)
        a = cuda.local.array(RM, float32)
        bk = cuda.local.array(RN, float32)
        pv = cuda.local.array(RE, float32)
        for r in range(RM):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(RE):
                o[r, e] = float32(0.0)

        if first < last:                      # the first tile straight to shared memory
            c0 = visit[tr, first] * Bc
            for u in range(NK):
                x = t + u * NT
                if x < Bc * D:
                    c = x // D
                    val = float32(0.0)
                    if c0 + c < Nk:
                        val = k[U(b), U(kh), U(c0 + c), U(x % D)]
                    sm[U(KS + c * DP + x % D)] = val
            for u in range(NV):
                x = t + u * NT
                if x < Bc * EP:
                    c = x // EP
                    e = x % EP
                    val = float32(0.0)
                    if c0 + c < Nk and e < Dv:
                        val = v[U(b), U(kh), U(c0 + c), U(e)]
                    sm[U(VS + c * EP + e)] = val

        for n in range(first, last):
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete
            has_next = n + 1 < last

            # S = Qs Ks^T on this thread's RM x RN micro-tile
            for r in range(RM):
                for c in range(RN):
                    s[r, c] = float32(0.0)
            for d in range(D):
                for r in range(RM):
                    a[r] = sm[U(QS + (ty + TY * r) * DP + d)]
                for c in range(RN):
                    bk[c] = sm[U(KS + (tx + TX * c) * DP + d)]
                for r in range(RM):
                    for c in range(RN):
                        s[r, c] += a[r] * bk[c]

            # the rules, the tail, the mask; each thread's share of its rows' max
            for r in range(RM):
                i = row0 + ty + TY * r
                mx = NEG_INF
                for c in range(RN):
                    j = c0 + tx + TX * c
                    sc = float32(softcap(s[r, c], cap))
                    if alibi:
                        sc -= slope * float32(alibi_distance(i, j, offset))
                    if j >= Nk or (kind == rules.PARTIAL and not visible(i, j, offset, left, right)):
                        sc = NEG_INF
                    s[r, c] = sc
                    mx = max_nan(mx, sc)
                sm[U(RED + (ty + TY * r) * TX + tx)] = mx
            cuda.syncthreads()                # every share written; nobody reads Ks any more

            # the row's new max (the TX threads of a row agree on it), P into shared memory
            for r in range(RM):
                row = ty + TY * r
                m_new = m[r]
                for x in range(TX):
                    m_new = max_nan(m_new, sm[U(RED + row * TX + x)])
                alpha = float32(rescale_exp2(m[r], m_new))
                shift = float32(shift_of(m_new))
                l[r] *= alpha
                for e in range(RE):
                    o[r, e] *= alpha
                m[r] = m_new
                for c in range(RN):
                    p = rules.exp2(s[r, c] - shift)
                    l[r] += p
                    sm[U(PS + row * BP + tx + TX * c)] = p
            cuda.syncthreads()                # P complete

            # O += P Vs on this thread's RM x RE micro-tile
            for c in range(Bc):
                for r in range(RM):
                    a[r] = sm[U(PS + (ty + TY * r) * BP + c)]
                for e in range(RE):
                    pv[e] = sm[U(VS + c * EP + tx + TX * e)]
                for r in range(RM):
                    for e in range(RE):
                        o[r, e] += a[r] * pv[e]
            cuda.syncthreads()                # everyone done with Ps (= Ks) and Vs

            if has_next:                      # the next tile into shared memory
                c1 = visit[tr, n + 1] * Bc
                for u in range(NK):
                    x = t + u * NT
                    if x < Bc * D:
                        val = float32(0.0)
                        if c1 + x // D < Nk:
                            val = k[U(b), U(kh), U(c1 + x // D), U(x % D)]
                        sm[U(KS + (x // D) * DP + x % D)] = val
                for u in range(NV):
                    x = t + u * NT
                    if x < Bc * EP:
                        c = x // EP
                        e = x % EP
                        val = float32(0.0)
                        if c1 + c < Nk and e < Dv:
                            val = v[U(b), U(kh), U(c1 + c), U(e)]
                        sm[U(VS + c * EP + e)] = val

        # each thread summed only its own keys: add the TX shares of every row's l
        cuda.syncthreads()
        for r in range(RM):
            sm[U(RED + (ty + TY * r) * TX + tx)] = l[r]
        cuda.syncthreads()
        for r in range(RM):
            row = ty + TY * r
            i = row0 + row
            total = float32(0.0)
            for x in range(TX):
                total += sm[U(RED + row * TX + x)]
            row_lse, inv_l = finalize(m[r] * LN2, total)
            if i < Nq:
                if tx == 0:
                    lse[split, b, h, i] = row_lse
                for e in range(RE):
                    if tx + TX * e < Dv:
                        out[split, b, h, i, tx + TX * e] = o[r, e] * float32(inv_l)

    _KERNELS[key] = tiled_forward_kernel
    return tiled_forward_kernel
