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
row by one float (``pad=1``).  Each part of an iteration is a device function
below, which ``tiled_prefetch`` shares; ``U`` is the index type (``uint64`` or
``int64``).
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32, int64, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from ...core import rules
from .device import alibi_rebased_distance, finalize, jit_options, max_nan, rescale_exp2, shift_of, softcap, visible
from .tiling import Tiling

_KERNELS = {}

if cuda is not None:
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)

    @cuda.jit(device=True, inline="always")
    def load_q(T, L, U, q, sm, scale, b, h, row0, t, Nq):
        """The Q tile into Qs, scaled (log2 units), zero past Nq."""
        for x in range(t, T.Br * L.D, T.threads):
            r = x // L.D
            d = x % L.D
            val = float32(0.0)
            if row0 + r < Nq:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(L.QS + r * L.DP + d)] = val

    @cuda.jit(device=True, inline="always")
    def start(T, L, o, m, l):
        """The online softmax's state before the first key tile: m = -inf, l = 0, O = 0."""
        for r in range(T.rm):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(L.RE):
                o[r, e] = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def load_kv(T, L, U, k, v, sm, c0, b, kh, t, Nk):
        """The key tile at c0 of K and V straight into Ks, Vs (zeros past Nk and Dv)."""
        for u in range(L.NK):
            x = t + u * T.threads
            if x < T.Bc * L.D:
                c = x // L.D
                val = float32(0.0)
                if c0 + c < Nk:
                    val = k[U(b), U(kh), U(c0 + c), U(x % L.D)]
                sm[U(L.KS + c * L.DP + x % L.D)] = val
        for u in range(L.NV):
            x = t + u * T.threads
            if x < T.Bc * L.EP:
                c = x // L.EP
                e = x % L.EP
                val = float32(0.0)
                if c0 + c < Nk and e < L.Dv:
                    val = v[U(b), U(kh), U(c0 + c), U(e)]
                sm[U(L.VS + c * L.EP + e)] = val

    @cuda.jit(device=True, inline="always")
    def scores(T, L, U, sm, s, a, bk, ty, tx):
        """S = Qs Ks^T on this thread's RM x RN micro-tile."""
        for r in range(T.rm):
            for c in range(T.rn):
                s[r, c] = float32(0.0)
        for d in range(L.D):
            for r in range(T.rm):
                a[r] = sm[U(L.QS + (ty + T.ty * r) * L.DP + d)]
            for c in range(T.rn):
                bk[c] = sm[U(L.KS + (tx + T.tx * c) * L.DP + d)]
            for r in range(T.rm):
                for c in range(T.rn):
                    s[r, c] += a[r] * bk[c]

    @cuda.jit(device=True, inline="always")
    def apply_rules(T, L, U, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right):
        """The rules, the tail, the mask; each thread's share of its rows' max into red."""
        for r in range(T.rm):
            i = row0 + ty + T.ty * r
            mx = NEG_INF
            for c in range(T.rn):
                j = c0 + tx + T.tx * c
                sc = float32(softcap(s[r, c], cap))
                if alibi:
                    sc -= slope * float32(alibi_rebased_distance(i, j, offset, Nk))
                if j >= Nk or (kind == rules.PARTIAL and not visible(i, j, offset, left, right)):
                    sc = NEG_INF
                s[r, c] = sc
                mx = max_nan(mx, sc)
            sm[U(L.RED + (ty + T.ty * r) * T.tx + tx)] = mx

    @cuda.jit(device=True, inline="always")
    def softmax_step(T, L, U, sm, s, m, l, o, ty, tx):
        """The row's new max (the TX threads of a row agree on it), O and l rescaled, P into Ps."""
        for r in range(T.rm):
            row = ty + T.ty * r
            m_new = m[r]
            for x in range(T.tx):
                m_new = max_nan(m_new, sm[U(L.RED + row * T.tx + x)])
            alpha = float32(rescale_exp2(m[r], m_new))
            shift = float32(shift_of(m_new))
            l[r] *= alpha
            for e in range(L.RE):
                o[r, e] *= alpha
            m[r] = m_new
            for c in range(T.rn):
                p = rules.exp2(s[r, c] - shift)
                l[r] += p
                sm[U(L.PS + row * L.BP + tx + T.tx * c)] = p

    @cuda.jit(device=True, inline="always")
    def accumulate(T, L, U, sm, o, a, pv, ty, tx):
        """O += P Vs on this thread's RM x RE micro-tile."""
        for c in range(T.Bc):
            for r in range(T.rm):
                a[r] = sm[U(L.PS + (ty + T.ty * r) * L.BP + c)]
            for e in range(L.RE):
                pv[e] = sm[U(L.VS + c * L.EP + tx + T.tx * e)]
            for r in range(T.rm):
                for e in range(L.RE):
                    o[r, e] += a[r] * pv[e]

    @cuda.jit(device=True, inline="always")
    def finish(T, L, U, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq):
        """Each thread summed only its own keys: the TX shares of every row's l added through red,
        then out and lse."""
        cuda.syncthreads()
        for r in range(T.rm):
            sm[U(L.RED + (ty + T.ty * r) * T.tx + tx)] = l[r]
        cuda.syncthreads()
        for r in range(T.rm):
            row = ty + T.ty * r
            i = row0 + row
            total = float32(0.0)
            for x in range(T.tx):
                total += sm[U(L.RED + row * T.tx + x)]
            row_lse, inv_l = finalize(m[r] * LN2, total)
            if i < Nq:
                if tx == 0:
                    lse[split, b, h, i] = row_lse
                for e in range(L.RE):
                    if tx + T.tx * e < L.Dv:
                        out[split, b, h, i, tx + T.tx * e] = o[r, e] * float32(inv_l)


def make_tiled_kernel(tiling: Tiling, D: int, Dv: int):
    """The micro-tiled forward kernel for one Tiling and head dims D, Dv (built once, kept)."""
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    T, L = tiling, tiling.layout(D, Dv)
    U = uint64 if tiling.unsigned else int64   # int64(x) changes nothing: numba's wraparound code stays

    @cuda.jit(**jit_options(T))
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
        tx = t % T.tx
        ty = t // T.tx
        row0 = tr * T.Br
        sm = cuda.shared.array(0, float32)
        slope = float32(slopes[b, h])

        # This split's share of the query tile's list of key tiles.
        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)
        load_q(T, L, U, q, sm, scale, b, h, row0, t, Nq)

        o = cuda.local.array((T.rm, L.RE), float32)
        m = cuda.local.array(T.rm, float32)
        l = cuda.local.array(T.rm, float32)
        s = cuda.local.array((T.rm, T.rn), float32)
        a = cuda.local.array(T.rm, float32)
        bk = cuda.local.array(T.rn, float32)
        pv = cuda.local.array(L.RE, float32)
        start(T, L, o, m, l)
        if first < last:                      # the first tile straight to shared memory
            load_kv(T, L, U, k, v, sm, visit[tr, first] * T.Bc, b, kh, t, Nk)

        for n in range(first, last):
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * T.Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete
            has_next = n + 1 < last
            scores(T, L, U, sm, s, a, bk, ty, tx)
            apply_rules(T, L, U, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
            cuda.syncthreads()                # every share written; nobody reads Ks any more
            softmax_step(T, L, U, sm, s, m, l, o, ty, tx)
            cuda.syncthreads()                # P complete
            accumulate(T, L, U, sm, o, a, pv, ty, tx)
            cuda.syncthreads()                # everyone done with Ps (= Ks) and Vs
            if has_next:                      # the next tile into shared memory
                load_kv(T, L, U, k, v, sm, visit[tr, n + 1] * T.Bc, b, kh, t, Nk)
        finish(T, L, U, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)

    _KERNELS[key] = tiled_forward_kernel
    return tiled_forward_kernel
