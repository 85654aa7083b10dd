"""Step ``tiled_vec4``: the micro-tiles rebuilt so that one shared load feeds many FMAs.

Every operand is read 4 floats at a time (``ld.shared.v4.f32``: rows padded to
multiples of 4 floats, a 16-byte-aligned buffer, constant-unrolled unsigned
indices), output dims are owned in chunks of 4, the row max and sum go by warp
shuffles, P has its own buffer, the mask is applied only on the tiles that need
one, and the grid runs from the last query tile to the first (under a causal
mask the longest rows start first).  K / V are still loaded and stored element
by element.

The steps from ``tiled_prefetch`` to here are this kernel, one switch of its
Tiling at a time, on ``tiled_prefetch``'s 64 x 32 tiles of 128 threads:
``tiled_rebuilt`` has them all off (row max and sum through shared memory as
in ``tiled``, ``tiled``'s grid order, the buffer with a float's alignment, so
that the compiler cannot merge four loads into one and every shared load stays
4 bytes); ``tiled_shuffle`` turns on the shuffles (``shuffle``),
``tiled_reorder`` the grid order (``last_first``), ``tiled_aligned`` the
16-byte loads (``align`` 16); ``tiled_vec4`` then takes 128 x 64 tiles of 256.
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from ...core import rules
from .device import (SIMULATOR, alibi_distance, finalize, max_nan, rescale_exp2, shift_of, softcap,
                     tile_slot, visible)
from .tiling import Tiling

_KERNELS = {}


def make_vec4_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_vec4: the micro-tiled kernel rebuilt so that one shared-memory load feeds many FMAs.

    ``tiled`` reads one float per load: its S loop issues RM + RN loads for RM x RN FMAs, its
    O loop RM + RE for RM x RE, and a multiprocessor issues one shared load per clock against
    four FMA instructions.  Here every operand comes four floats at a time (one
    ``ld.shared.v4.f32``: rows padded to multiples of 4 floats, a 16-byte-aligned buffer,
    unsigned constant-unrolled indices, so that the compiler can prove the alignment):

    - S: for each group of 4 dims, RM loads of Q and RN of K feed 4 x RM x RN FMAs;
    - O: for each group of 4 keys, RM loads of P and 4 x RG of V (a thread owns its output dims
      in chunks of 4) feed 4 x RM x RE FMAs.

    The row max and the row sum are reduced over the TX threads of a row with warp shuffles
    (no barrier; the simulator, which has no shuffles, goes through shared memory), P has its
    own buffer, the tail key tile and the partial tiles alone pay for the mask, and the grid
    runs the query tiles from the last to the first: under a causal mask the last tiles visit
    the most key tiles, and starting them first leaves the short ones to fill the end.
    """
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    L = tiling.layout(D, Dv)
    Br, Bc, NT, TX, TY, RM, RN = tiling.Br, tiling.Bc, tiling.threads, tiling.tx, tiling.ty, tiling.rm, tiling.rn
    QS, KS, PS, VS, RED, DP, EP, BP, RE, RG, D4 = (
        L[n] for n in ("QS", "KS", "PS", "VS", "RED", "DP", "EP", "BP", "RE", "RG", "D4"))
    U = uint64
    NK = -(-Bc * D4 // NT)           # K elements each thread loads per tile
    NV = -(-Bc * EP // NT)
    k_slot, v_slot = tile_slot(NT, Bc, D4), tile_slot(NT, Bc, EP)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)
    ALL = 0xFFFFFFFF
    ALIGN = tiling.align
    SHARED_REDUCE = SIMULATOR or not tiling.shuffle   # numba's simulator has no warp shuffles
    LAST_FIRST = tiling.last_first

    caps = {} if SIMULATOR or not tiling.max_regs else {"max_registers": tiling.max_regs}

    @cuda.jit(fastmath=True, **caps)
    def vec4_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                            offset, left, right, out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)
        (``last_first`` False: (Tr, B*H, S))."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        if LAST_FIRST:
            b = cuda.blockIdx.x // H
            h = cuda.blockIdx.x % H
            tr = cuda.gridDim.y - 1 - cuda.blockIdx.y     # the last query tiles (the longest rows) first
        else:                                             # tiled's order: query tiles fastest, first first
            tr = cuda.blockIdx.x
            b = cuda.blockIdx.y // H
            h = cuda.blockIdx.y % H
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % TX
        ty = t // TX
        row0 = tr * Br
        if SIMULATOR or not ALIGN:    # the simulator takes no alignment (and needs none); no ALIGN: 4-byte loads
            sm = cuda.shared.array(0, float32)
        else:
            sm = cuda.shared.array(0, float32, alignment=ALIGN)
        slope = float32(slopes[b, h])

        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)

        for x in range(t, Br * D4, NT):       # Q tile, scaled (log2 units), zero past Nq and D
            r = x // D4
            d = x % D4
            val = float32(0.0)
            if row0 + r < Nq and d < D:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(QS + r * DP + d)] = val

        kc, kd, vc, ve = t // D4, t % D4, t // EP, t % EP
        o = cuda.local.array((RM, RE), float32)
        m = cuda.local.array(RM, float32)
        l = cuda.local.array(RM, float32)
        s = cuda.local.array((RM, RN), float32)
        qa = cuda.local.array((RM, 4), float32)
        kb = cuda.local.array((RN, 4), float32)
        vb = cuda.local.array((RG, 4), float32)
        rmax = cuda.local.array(RM, float32)
        for r in range(RM):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(RE):
                o[r, e] = float32(0.0)

        # K and V loaded and stored element by element at the top of each iteration, nothing ahead:
        # batching the loads is left to the compiler.  The loop is tiled_staged's, which issues the
        # first tile's loads in iteration first - 1; here that iteration does nothing.
        for n in range(first - 1, last):
            if n >= first:
                cuda.syncthreads()            # nobody reads the last tile's Ks, Vs, Ps any more
                for u in range(NK):
                    c, d, ok = k_slot(u, t, kc, kd)
                    if ok:
                        val = float32(0.0)
                        if visit[tr, n] * Bc + c < Nk and (D4 == D or d < D):
                            val = k[U(b), U(kh), U(visit[tr, n] * Bc + c), U(d)]
                        sm[U(KS + c * DP + d)] = val
                for u in range(NV):
                    c, e, ok = v_slot(u, t, vc, ve)
                    if ok:
                        val = float32(0.0)
                        if visit[tr, n] * Bc + c < Nk and (EP == Dv or e < Dv):
                            val = v[U(b), U(kh), U(visit[tr, n] * Bc + c), U(e)]
                        sm[U(VS + c * EP + e)] = val
            if n < first:
                continue
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete

            # S = Qs Ks^T on this thread's RM x RN micro-tile, 4 dims per load
            for r in range(RM):
                for c in range(RN):
                    s[r, c] = float32(0.0)
            for d4 in range(D4 // 4):
                d = d4 * 4
                for r in range(RM):
                    for j in range(4):
                        qa[r, j] = sm[U(QS + (ty + TY * r) * DP + d + j)]
                for c in range(RN):
                    for j in range(4):
                        kb[c, j] = sm[U(KS + (tx + TX * c) * DP + d + j)]
                for r in range(RM):
                    for c in range(RN):
                        for j in range(4):
                            s[r, c] += qa[r, j] * kb[c, j]

            # the rules, only where a tile needs them (softcap, ALiBi, a partial or a tail tile):
            # they go through this thread's own places in Ps, so that the loop that applies them
            # (too long to unroll) never indexes s, which must stay in registers
            edge = kind == rules.PARTIAL or c0 + Bc > Nk
            if edge or alibi or cap > 0:
                for r in range(RM):
                    for c in range(RN):
                        sm[U(PS + (ty + TY * r) * BP + tx + TX * c)] = s[r, c]
                for r in range(RM):
                    i = row0 + ty + TY * r
                    for c in range(RN):
                        j = c0 + tx + TX * c
                        at = U(PS + (ty + TY * r) * BP + tx + TX * c)
                        sc = float32(softcap(sm[at], cap))
                        if alibi:
                            sc -= slope * float32(alibi_distance(i, j, offset))
                        if edge:
                            if j >= Nk or not visible(i, j, offset, left, right):
                                sc = NEG_INF
                        sm[at] = sc
                for r in range(RM):
                    for c in range(RN):
                        s[r, c] = sm[U(PS + (ty + TY * r) * BP + tx + TX * c)]
            for r in range(RM):
                mx = NEG_INF
                for c in range(RN):
                    mx = max_nan(mx, s[r, c])
                if SHARED_REDUCE:
                    sm[U(RED + (ty + TY * r) * TX + tx)] = mx
                else:                         # the TX threads of a row are TX neighbouring lanes
                    for w in (16, 8, 4, 2, 1):    # unrolled; a constant test drops the steps past TX
                        if w < TX:
                            mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, w))
                    rmax[r] = mx
            if SHARED_REDUCE:
                cuda.syncthreads()
                for r in range(RM):
                    mx = NEG_INF
                    for x in range(TX):
                        mx = max_nan(mx, sm[U(RED + (ty + TY * r) * TX + x)])
                    rmax[r] = mx

            # the row's new max (all TX threads of a row agree on it), P into shared memory
            for r in range(RM):
                m_new = max_nan(m[r], rmax[r])
                alpha = float32(rescale_exp2(m[r], m_new))
                shift = float32(shift_of(m_new))
                l[r] *= alpha
                for e in range(RE):
                    o[r, e] *= alpha
                m[r] = m_new
                for c in range(RN):
                    p = rules.exp2(s[r, c] - shift)
                    l[r] += p
                    sm[U(PS + (ty + TY * r) * BP + tx + TX * c)] = p
            cuda.syncthreads()                # P complete

            # O += P Vs on this thread's RM x RE micro-tile, 4 keys per load of P
            for c4 in range(Bc // 4):
                c = c4 * 4
                for r in range(RM):
                    for j in range(4):
                        qa[r, j] = sm[U(PS + (ty + TY * r) * BP + c + j)]
                for j in range(4):
                    for g in range(RG):
                        for jj in range(4):
                            vb[g, jj] = sm[U(VS + (c + j) * EP + 4 * tx + 4 * TX * g + jj)]
                    for r in range(RM):
                        for g in range(RG):
                            for jj in range(4):
                                o[r, 4 * g + jj] += qa[r, j] * vb[g, jj]

        # each thread summed only its own keys: add the TX shares of every row's l
        if SHARED_REDUCE:
            cuda.syncthreads()
            for r in range(RM):
                sm[U(RED + (ty + TY * r) * TX + tx)] = l[r]
            cuda.syncthreads()
        for r in range(RM):
            total = l[r]
            if SHARED_REDUCE:
                total = float32(0.0)
                for x in range(TX):
                    total += sm[U(RED + (ty + TY * r) * TX + x)]
            else:
                for w in (16, 8, 4, 2, 1):
                    if w < TX:
                        total += cuda.shfl_xor_sync(ALL, total, w)
            i = row0 + ty + TY * r
            row_lse, inv_l = finalize(m[r] * LN2, total)
            if i < Nq:
                if tx == 0:
                    lse[split, b, h, i] = row_lse
                for g in range(RG):
                    for jj in range(4):
                        e = 4 * tx + 4 * TX * g + jj
                        if e < Dv:
                            out[split, b, h, i, e] = o[r, 4 * g + jj] * float32(inv_l)

    _KERNELS[key] = vec4_forward_kernel
    return vec4_forward_kernel
