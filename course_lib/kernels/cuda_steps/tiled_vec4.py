"""Steps ``tiled_rebuilt`` to ``tiled_vec4``: the micro-tiles rebuilt so that one shared load feeds many FMAs.

``tiled`` reads one float per load: its S loop issues RM + RN loads for RM x RN
FMAs, its O loop RM + RE for RM x RE, and a multiprocessor issues one shared
load per clock against four FMA instructions.  Here every operand comes four
floats at a time (one ``ld.shared.v4.f32``: rows padded to multiples of 4
floats, a 16-byte-aligned buffer, unsigned constant-unrolled indices, so that
the compiler can prove the alignment):

- S: for each group of 4 dims, RM loads of Q and RN of K feed 4 x RM x RN FMAs;
- O: for each group of 4 keys, RM loads of P and 4 x RG of V (a thread owns its
  output dims in chunks of 4) feed 4 x RM x RE FMAs.

P has its own buffer, the tail key tile and the partial tiles alone pay for the
mask, and K / V are still loaded and stored element by element (nothing ahead).
The parts every version shares are device functions here (``tiled_staged``
uses them too); each version's kernel is the one before it with one change:

    rebuilt_kernel    tiled_rebuilt: the rebuilt micro-tiles on ``tiled_prefetch``'s 64 x 32 tiles of
                      128 threads, row max and sum through shared memory as in ``tiled``, ``tiled``'s grid
                      order, the buffer with a float's alignment (every shared load stays 4 bytes)
    shuffle_kernel    tiled_shuffle: the row max and sum by warp shuffles (one barrier a tile fewer)
    reorder_kernel    tiled_reorder: the grid runs heads fastest and the last query tile first (under a
                      causal mask the longest rows start first, the short ones fill the end)
    aligned_kernel    tiled_aligned: the buffer declared 16-byte aligned, so four loads merge into one;
                      ``tiled_vec4`` is this kernel on 128 x 64 tiles of 256 threads

In numba's simulator, which has no warp shuffles, the shuffles go through
shared memory, and the buffer takes no alignment (it needs none).
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from ...core import rules
from .device import (
    SIMULATOR,
    alibi_rebased_distance,
    finalize,
    jit_options,
    max_nan,
    rescale_exp2,
    shift_of,
    softcap,
    tile_slot,
    visible,
)
from .tiling import Tiling

_KERNELS = {}
ALL = 0xFFFFFFFF                               # every lane of a warp takes part in a shuffle

if cuda is not None:
    U = uint64                                 # every shared and global index unsigned (tiled_unsigned's step)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)

    @cuda.jit(device=True, inline="always")
    def load_q(T, L, q, sm, scale, b, h, row0, t, Nq):
        """The Q tile into Qs, scaled (log2 units), zero past Nq and D."""
        for x in range(t, T.Br * L.D4, T.threads):
            r = x // L.D4
            d = x % L.D4
            val = float32(0.0)
            if row0 + r < Nq and d < L.D:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(L.QS + r * L.DP + d)] = val

    @cuda.jit(device=True, inline="always")
    def load_kv(T, L, k, v, sm, visit, tr, n, b, kh, t, kc, kd, vc, ve, Nk):
        """Key tile visit[tr, n] of K and V into Ks, Vs, element by element (zeros past Nk, D and Dv):
        batching the loads is left to the compiler."""
        for u in range(L.NK):
            c, d, ok = tile_slot(T, L.D4, u, t, kc, kd)
            if ok:
                val = float32(0.0)
                if visit[tr, n] * T.Bc + c < Nk and (L.D4 == L.D or d < L.D):
                    val = k[U(b), U(kh), U(visit[tr, n] * T.Bc + c), U(d)]
                sm[U(L.KS + c * L.DP + d)] = val
        for u in range(L.NV):
            c, e, ok = tile_slot(T, L.EP, u, t, vc, ve)
            if ok:
                val = float32(0.0)
                if visit[tr, n] * T.Bc + c < Nk and (L.EP == L.Dv or e < L.Dv):
                    val = v[U(b), U(kh), U(visit[tr, n] * T.Bc + c), U(e)]
                sm[U(L.VS + c * L.EP + e)] = val

    @cuda.jit(device=True, inline="always")
    def start(T, L, o, m, l):
        """The online softmax's state before the first key tile: m = -inf, l = 0, O = 0."""
        for r in range(T.rm):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(L.RE):
                o[r, e] = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def scores(T, L, sm, s, qa, kb, ty, tx):
        """S = Qs Ks^T on this thread's RM x RN micro-tile, 4 dims per load."""
        for r in range(T.rm):
            for c in range(T.rn):
                s[r, c] = float32(0.0)
        for d4 in range(L.D4 // 4):
            d = d4 * 4
            for r in range(T.rm):
                for j in range(4):
                    qa[r, j] = sm[U(L.QS + (ty + T.ty * r) * L.DP + d + j)]
            for c in range(T.rn):
                for j in range(4):
                    kb[c, j] = sm[U(L.KS + (tx + T.tx * c) * L.DP + d + j)]
            for r in range(T.rm):
                for c in range(T.rn):
                    for j in range(4):
                        s[r, c] += qa[r, j] * kb[c, j]

    @cuda.jit(device=True, inline="always")
    def apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right):
        """The rules, only where a tile needs them (softcap, ALiBi, a partial or a tail tile).  They go
        through this thread's own places in Ps, so that the loop that applies them (too long to unroll)
        never indexes s, which must stay in registers."""
        edge = kind == rules.PARTIAL or c0 + T.Bc > Nk
        if edge or alibi or cap > 0:
            for r in range(T.rm):
                for c in range(T.rn):
                    sm[U(L.PS + (ty + T.ty * r) * L.BP + tx + T.tx * c)] = s[r, c]
            for r in range(T.rm):
                i = row0 + ty + T.ty * r
                for c in range(T.rn):
                    j = c0 + tx + T.tx * c
                    at = U(L.PS + (ty + T.ty * r) * L.BP + tx + T.tx * c)
                    sc = float32(softcap(sm[at], cap))
                    if alibi:
                        sc -= slope * float32(alibi_rebased_distance(i, j, offset, Nk))
                    if edge:
                        if j >= Nk or not visible(i, j, offset, left, right):
                            sc = NEG_INF
                    sm[at] = sc
            for r in range(T.rm):
                for c in range(T.rn):
                    s[r, c] = sm[U(L.PS + (ty + T.ty * r) * L.BP + tx + T.tx * c)]

    @cuda.jit(device=True, inline="always")
    def row_max_shared(T, L, sm, s, rmax, ty, tx):
        """rmax: the max of each of this thread's rows over the tile, its TX threads' shares written to
        red, a barrier, and every share read back."""
        for r in range(T.rm):
            mx = NEG_INF
            for c in range(T.rn):
                mx = max_nan(mx, s[r, c])
            sm[U(L.RED + (ty + T.ty * r) * T.tx + tx)] = mx
        cuda.syncthreads()
        for r in range(T.rm):
            mx = NEG_INF
            for x in range(T.tx):
                mx = max_nan(mx, sm[U(L.RED + (ty + T.ty * r) * T.tx + x)])
            rmax[r] = mx

    @cuda.jit(device=True, inline="always")
    def row_max_shuffle(T, L, sm, s, rmax, ty, tx):
        """rmax as ``row_max_shared``'s, by warp shuffles: the TX threads of a row are TX neighbouring
        lanes (no barrier)."""
        if SIMULATOR:
            row_max_shared(T, L, sm, s, rmax, ty, tx)
        else:
            for r in range(T.rm):
                mx = NEG_INF
                for c in range(T.rn):
                    mx = max_nan(mx, s[r, c])
                for w in (16, 8, 4, 2, 1):    # unrolled; a constant test drops the steps past TX
                    if w < T.tx:
                        mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, w))
                rmax[r] = mx

    @cuda.jit(device=True, inline="always")
    def softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx):
        """The row's new max (all TX threads of a row agree on it), O and l rescaled, P into Ps."""
        for r in range(T.rm):
            m_new = max_nan(m[r], rmax[r])
            alpha = float32(rescale_exp2(m[r], m_new))
            shift = float32(shift_of(m_new))
            l[r] *= alpha
            for e in range(L.RE):
                o[r, e] *= alpha
            m[r] = m_new
            for c in range(T.rn):
                p = rules.exp2(s[r, c] - shift)
                l[r] += p
                sm[U(L.PS + (ty + T.ty * r) * L.BP + tx + T.tx * c)] = p

    @cuda.jit(device=True, inline="always")
    def accumulate(T, L, sm, o, qa, vb, ty, tx):
        """O += P Vs on this thread's RM x RE micro-tile, 4 keys per load of P."""
        for c4 in range(T.Bc // 4):
            c = c4 * 4
            for r in range(T.rm):
                for j in range(4):
                    qa[r, j] = sm[U(L.PS + (ty + T.ty * r) * L.BP + c + j)]
            for j in range(4):
                for g in range(L.RG):
                    for jj in range(4):
                        vb[g, jj] = sm[U(L.VS + (c + j) * L.EP + 4 * tx + 4 * T.tx * g + jj)]
                for r in range(T.rm):
                    for g in range(L.RG):
                        for jj in range(4):
                            o[r, 4 * g + jj] += qa[r, j] * vb[g, jj]

    @cuda.jit(device=True, inline="always")
    def write_row(T, L, m, o, out, lse, r, total, split, b, h, row0, ty, tx, Nq):
        """Row r of this thread's micro-tile, its l summed over the row (``total``): out and lse."""
        i = row0 + ty + T.ty * r
        row_lse, inv_l = finalize(m[r] * LN2, total)
        if i < Nq:
            if tx == 0:
                lse[split, b, h, i] = row_lse
            for g in range(L.RG):
                for jj in range(4):
                    e = 4 * tx + 4 * T.tx * g + jj
                    if e < L.Dv:
                        out[split, b, h, i, e] = o[r, 4 * g + jj] * float32(inv_l)

    @cuda.jit(device=True, inline="always")
    def finish_shared(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq):
        """Each thread summed only its own keys: the TX shares of every row's l added through red."""
        cuda.syncthreads()
        for r in range(T.rm):
            sm[U(L.RED + (ty + T.ty * r) * T.tx + tx)] = l[r]
        cuda.syncthreads()
        for r in range(T.rm):
            total = float32(0.0)
            for x in range(T.tx):
                total += sm[U(L.RED + (ty + T.ty * r) * T.tx + x)]
            write_row(T, L, m, o, out, lse, r, total, split, b, h, row0, ty, tx, Nq)

    @cuda.jit(device=True, inline="always")
    def finish_shuffle(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq):
        """``finish_shared``'s sums by warp shuffles."""
        if SIMULATOR:
            finish_shared(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)
        else:
            for r in range(T.rm):
                total = l[r]
                for w in (16, 8, 4, 2, 1):
                    if w < T.tx:
                        total += cuda.shfl_xor_sync(ALL, total, w)
                write_row(T, L, m, o, out, lse, r, total, split, b, h, row0, ty, tx, Nq)


def _built(name, tiling, D, Dv, make):
    """The kernel ``make(T, L)`` builds for one Tiling and head dims D, Dv, built once and kept."""
    key = (name, tiling, D, Dv)
    if key not in _KERNELS:
        tiling.check(D, Dv)
        _KERNELS[key] = make(tiling, tiling.layout(D, Dv))
    return _KERNELS[key]


def make_rebuilt_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_rebuilt: the micro-tiles rebuilt for 4-float loads, reductions and grid as in ``tiled``."""
    def make(T, L):
        @cuda.jit(**jit_options(T))
        def rebuilt_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left,
                           right, out, lse):
            """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (Tr, B*H, S)."""
            H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
            tr = cuda.blockIdx.x                              # tiled's order: query tiles fastest, first first
            b = cuda.blockIdx.y // H
            h = cuda.blockIdx.y % H
            kh = kv_head[h]
            split = cuda.blockIdx.z
            t = cuda.threadIdx.x
            tx = t % T.tx
            ty = t // T.tx
            row0 = tr * T.Br
            sm = cuda.shared.array(0, float32)                # a float's alignment: 4-byte loads only
            slope = float32(slopes[b, h])

            n_all = nvisit[tr]
            per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
            first = split * per
            last = min(n_all, first + per)
            load_q(T, L, q, sm, scale, b, h, row0, t, Nq)

            kc, kd, vc, ve = t // L.D4, t % L.D4, t // L.EP, t % L.EP
            o = cuda.local.array((T.rm, L.RE), float32)
            m = cuda.local.array(T.rm, float32)
            l = cuda.local.array(T.rm, float32)
            s = cuda.local.array((T.rm, T.rn), float32)
            qa = cuda.local.array((T.rm, 4), float32)
            kb = cuda.local.array((T.rn, 4), float32)
            vb = cuda.local.array((L.RG, 4), float32)
            rmax = cuda.local.array(T.rm, float32)
            start(T, L, o, m, l)
            # The loop is tiled_staged's, which issues the first tile's loads in iteration first - 1;
            # here that iteration does nothing.
            for n in range(first - 1, last):
                if n >= first:
                    cuda.syncthreads()                        # nobody reads the last tile's Ks, Vs, Ps any more
                    load_kv(T, L, k, v, sm, visit, tr, n, b, kh, t, kc, kd, vc, ve, Nk)
                if n < first:
                    continue
                tc = visit[tr, n]
                kind = tiles[tr, tc]
                c0 = tc * T.Bc
                cuda.syncthreads()                            # Ks, Vs (and Qs) complete
                scores(T, L, sm, s, qa, kb, ty, tx)
                apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
                row_max_shared(T, L, sm, s, rmax, ty, tx)
                softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx)
                cuda.syncthreads()                            # P complete
                accumulate(T, L, sm, o, qa, vb, ty, tx)
            finish_shared(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)
        return rebuilt_kernel
    return _built("rebuilt", tiling, D, Dv, make)


def make_shuffle_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_shuffle: tiled_rebuilt with the row max and sum by warp shuffles."""
    def make(T, L):
        @cuda.jit(**jit_options(T))
        def shuffle_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left,
                           right, out, lse):
            """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (Tr, B*H, S)."""
            H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
            tr = cuda.blockIdx.x
            b = cuda.blockIdx.y // H
            h = cuda.blockIdx.y % H
            kh = kv_head[h]
            split = cuda.blockIdx.z
            t = cuda.threadIdx.x
            tx = t % T.tx
            ty = t // T.tx
            row0 = tr * T.Br
            sm = cuda.shared.array(0, float32)
            slope = float32(slopes[b, h])

            n_all = nvisit[tr]
            per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
            first = split * per
            last = min(n_all, first + per)
            load_q(T, L, q, sm, scale, b, h, row0, t, Nq)

            kc, kd, vc, ve = t // L.D4, t % L.D4, t // L.EP, t % L.EP
            o = cuda.local.array((T.rm, L.RE), float32)
            m = cuda.local.array(T.rm, float32)
            l = cuda.local.array(T.rm, float32)
            s = cuda.local.array((T.rm, T.rn), float32)
            qa = cuda.local.array((T.rm, 4), float32)
            kb = cuda.local.array((T.rn, 4), float32)
            vb = cuda.local.array((L.RG, 4), float32)
            rmax = cuda.local.array(T.rm, float32)
            start(T, L, o, m, l)
            for n in range(first - 1, last):
                if n >= first:
                    cuda.syncthreads()
                    load_kv(T, L, k, v, sm, visit, tr, n, b, kh, t, kc, kd, vc, ve, Nk)
                if n < first:
                    continue
                tc = visit[tr, n]
                kind = tiles[tr, tc]
                c0 = tc * T.Bc
                cuda.syncthreads()
                scores(T, L, sm, s, qa, kb, ty, tx)
                apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
                row_max_shuffle(T, L, sm, s, rmax, ty, tx)    # the change: no barrier, no shared round trip
                softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx)
                cuda.syncthreads()
                accumulate(T, L, sm, o, qa, vb, ty, tx)
            finish_shuffle(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)   # and here
        return shuffle_kernel
    return _built("shuffle", tiling, D, Dv, make)


def make_reorder_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_reorder: tiled_shuffle with the grid running heads fastest and the last query tile first."""
    def make(T, L):
        @cuda.jit(**jit_options(T))
        def reorder_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left,
                           right, out, lse):
            """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)."""
            H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
            b = cuda.blockIdx.x // H                          # the change: heads fastest,
            h = cuda.blockIdx.x % H
            tr = cuda.gridDim.y - 1 - cuda.blockIdx.y         # the last query tiles (the longest rows) first
            kh = kv_head[h]
            split = cuda.blockIdx.z
            t = cuda.threadIdx.x
            tx = t % T.tx
            ty = t // T.tx
            row0 = tr * T.Br
            sm = cuda.shared.array(0, float32)
            slope = float32(slopes[b, h])

            n_all = nvisit[tr]
            per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
            first = split * per
            last = min(n_all, first + per)
            load_q(T, L, q, sm, scale, b, h, row0, t, Nq)

            kc, kd, vc, ve = t // L.D4, t % L.D4, t // L.EP, t % L.EP
            o = cuda.local.array((T.rm, L.RE), float32)
            m = cuda.local.array(T.rm, float32)
            l = cuda.local.array(T.rm, float32)
            s = cuda.local.array((T.rm, T.rn), float32)
            qa = cuda.local.array((T.rm, 4), float32)
            kb = cuda.local.array((T.rn, 4), float32)
            vb = cuda.local.array((L.RG, 4), float32)
            rmax = cuda.local.array(T.rm, float32)
            start(T, L, o, m, l)
            for n in range(first - 1, last):
                if n >= first:
                    cuda.syncthreads()
                    load_kv(T, L, k, v, sm, visit, tr, n, b, kh, t, kc, kd, vc, ve, Nk)
                if n < first:
                    continue
                tc = visit[tr, n]
                kind = tiles[tr, tc]
                c0 = tc * T.Bc
                cuda.syncthreads()
                scores(T, L, sm, s, qa, kb, ty, tx)
                apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
                row_max_shuffle(T, L, sm, s, rmax, ty, tx)
                softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx)
                cuda.syncthreads()
                accumulate(T, L, sm, o, qa, vb, ty, tx)
            finish_shuffle(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)
        return reorder_kernel
    return _built("reorder", tiling, D, Dv, make)


def make_aligned_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_aligned (and tiled_vec4): tiled_reorder with the shared buffer declared 16-byte aligned."""
    def make(T, L):
        @cuda.jit(**jit_options(T))
        def aligned_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left,
                           right, out, lse):
            """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)."""
            H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
            b = cuda.blockIdx.x // H
            h = cuda.blockIdx.x % H
            tr = cuda.gridDim.y - 1 - cuda.blockIdx.y
            kh = kv_head[h]
            split = cuda.blockIdx.z
            t = cuda.threadIdx.x
            tx = t % T.tx
            ty = t // T.tx
            row0 = tr * T.Br
            if SIMULATOR:                                     # the simulator takes no alignment (and needs none)
                sm = cuda.shared.array(0, float32)
            else:                                             # the change: 16-byte loads become provable
                sm = cuda.shared.array(0, float32, alignment=16)
            slope = float32(slopes[b, h])

            n_all = nvisit[tr]
            per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
            first = split * per
            last = min(n_all, first + per)
            load_q(T, L, q, sm, scale, b, h, row0, t, Nq)

            kc, kd, vc, ve = t // L.D4, t % L.D4, t // L.EP, t % L.EP
            o = cuda.local.array((T.rm, L.RE), float32)
            m = cuda.local.array(T.rm, float32)
            l = cuda.local.array(T.rm, float32)
            s = cuda.local.array((T.rm, T.rn), float32)
            qa = cuda.local.array((T.rm, 4), float32)
            kb = cuda.local.array((T.rn, 4), float32)
            vb = cuda.local.array((L.RG, 4), float32)
            rmax = cuda.local.array(T.rm, float32)
            start(T, L, o, m, l)
            for n in range(first - 1, last):
                if n >= first:
                    cuda.syncthreads()
                    load_kv(T, L, k, v, sm, visit, tr, n, b, kh, t, kc, kd, vc, ve, Nk)
                if n < first:
                    continue
                tc = visit[tr, n]
                kind = tiles[tr, tc]
                c0 = tc * T.Bc
                cuda.syncthreads()
                scores(T, L, sm, s, qa, kb, ty, tx)
                apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
                row_max_shuffle(T, L, sm, s, rmax, ty, tx)
                softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx)
                cuda.syncthreads()
                accumulate(T, L, sm, o, qa, vb, ty, tx)
            finish_shuffle(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)
        return aligned_kernel
    return _built("aligned", tiling, D, Dv, make)


# Each of tiled_vec4's steps, by its Tiling's (shuffle, last_first, align) (``tiling.VEC_SWITCHES``).
VEC_FACTORY = {(False, False, 0): make_rebuilt_kernel, (True, False, 0): make_shuffle_kernel,
               (True, True, 0): make_reorder_kernel, (True, True, 16): make_aligned_kernel}
