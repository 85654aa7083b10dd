"""Step ``tiled_staged`` (and ``tuned``): ``tiled_vec4`` with every K / V load of a tile in flight at once.

The loads of tile n + 1 are all issued into registers before the first of them
is stored, a tile ahead, at flat offsets; the rest is ``tiled_vec4``'s kernel.
``tuned`` is this kernel with the tile sizes and threads per block that
``tuning.autotune`` picked per head dim.
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


def make_staged_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_vec4's kernel with K / V staged through registers a tile ahead (built once, kept).

    ``tiled_vec4`` leaves the batching of its element-by-element loads to the compiler, which at
    D=128 unrolls them only 8 deep: 8 trips to memory per tile, with the SM's one block waiting at
    each.  Here every load of tile n + 1 is issued into registers (``kreg``, ``vreg``) before the
    first is stored, while tile n is computed, at flat offsets (constants folded into the load
    instructions).
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

    caps = {} if SIMULATOR or not tiling.max_regs else {"max_registers": tiling.max_regs}

    @cuda.jit(fastmath=True, **caps)
    def staged_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                              offset, left, right, out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)."""
        H, Nq, Nk, Hk = q.shape[1], q.shape[2], k.shape[2], k.shape[1]
        b = cuda.blockIdx.x // H
        h = cuda.blockIdx.x % H
        tr = cuda.gridDim.y - 1 - cuda.blockIdx.y     # the last query tiles (the longest rows) first
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % TX
        ty = t // TX
        row0 = tr * Br
        if SIMULATOR:                 # the simulator takes no alignment (and needs none)
            sm = cuda.shared.array(0, float32)
        else:
            sm = cuda.shared.array(0, float32, alignment=16)
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

        kreg = cuda.local.array(NK, float32)
        vreg = cuda.local.array(NV, float32)
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

        # K and V go through registers, every load of a tile issued before the first of them is
        # needed (one trip to memory per tile, not one per element), tile n + 1's loads in flight
        # while tile n is computed; iteration first - 1 only issues the first tile's.
        for n in range(first - 1, last):
            if n >= first:
                cuda.syncthreads()            # nobody reads the last tile's Ks, Vs, Ps any more
                for u in range(NK):
                    c, d, ok = k_slot(u, t, kc, kd)
                    if ok:
                        sm[U(KS + c * DP + d)] = kreg[u]
                for u in range(NV):
                    c, e, ok = v_slot(u, t, vc, ve)
                    if ok:
                        sm[U(VS + c * EP + e)] = vreg[u]
            if n + 1 < last:
                c1 = visit[tr, n + 1] * Bc
                # On the GPU an element is read at its flat offset, k[0, 0, 0, x]: the arrays are
                # C-contiguous (the address is just data + 4 x) and numba checks no bounds there,
                # so the offsets of a thread's NK loads differ by constants the compiler folds into
                # the load instructions, instead of a 64-bit multiply by a run-time shape each.
                kflat = ((b * Hk + kh) * Nk + c1) * D
                vflat = ((b * Hk + kh) * Nk + c1) * Dv
                for u in range(NK):
                    c, d, ok = k_slot(u, t, kc, kd)
                    val = float32(0.0)
                    if ok and c1 + c < Nk and (D4 == D or d < D):
                        if SIMULATOR:             # the simulator's arrays check their bounds
                            val = k[U(b), U(kh), U(c1 + c), U(d)]
                        else:
                            val = k[0, 0, 0, U(kflat + c * D + d)]
                    kreg[u] = val
                for u in range(NV):
                    c, e, ok = v_slot(u, t, vc, ve)
                    val = float32(0.0)
                    if ok and c1 + c < Nk and (EP == Dv or e < Dv):
                        if SIMULATOR:
                            val = v[U(b), U(kh), U(c1 + c), U(e)]
                        else:
                            val = v[0, 0, 0, U(vflat + c * Dv + e)]
                    vreg[u] = val
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
                if SIMULATOR:
                    sm[U(RED + (ty + TY * r) * TX + tx)] = mx
                else:                         # the TX threads of a row are TX neighbouring lanes
                    for w in (16, 8, 4, 2, 1):    # unrolled; a constant test drops the steps past TX
                        if w < TX:
                            mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, w))
                    rmax[r] = mx
            if SIMULATOR:
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
        if SIMULATOR:
            cuda.syncthreads()
            for r in range(RM):
                sm[U(RED + (ty + TY * r) * TX + tx)] = l[r]
            cuda.syncthreads()
        for r in range(RM):
            total = l[r]
            if SIMULATOR:
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

    _KERNELS[key] = staged_forward_kernel
    return staged_forward_kernel
