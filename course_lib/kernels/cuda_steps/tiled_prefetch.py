"""Step ``tiled_prefetch``: ``tiled_padded`` with the next K / V tile loaded a tile ahead.

The loads of key tile n + 1 from global memory into registers (``kreg``,
``vreg``) are issued at the top of iteration n, before its arithmetic, and
stored to shared memory after it: the load latency hides behind the
arithmetic instead of stalling the block at the end of each iteration.
Everything else is ``tiled``'s kernel, from the same device functions.
"""
from __future__ import annotations

try:
    from numba import cuda, float32, int64, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from .device import jit_options
from .tiling import Tiling

_KERNELS = {}

if cuda is not None:
    from .tiled import accumulate, apply_rules, finish, load_kv, load_q, scores, softmax_step, start

    @cuda.jit(device=True, inline="always")
    def issue_kv(T, L, U, k, v, kreg, vreg, c1, b, kh, t, Nk):
        """The key tile at c1 of K and V into registers (zeros past Nk and Dv): issued now, used later."""
        for u in range(L.NK):
            x = t + u * T.threads
            c = x // L.D
            kreg[u] = float32(0.0)
            if x < T.Bc * L.D and c1 + c < Nk:
                kreg[u] = k[U(b), U(kh), U(c1 + c), U(x % L.D)]
        for u in range(L.NV):
            x = t + u * T.threads
            c = x // L.EP
            e = x % L.EP
            vreg[u] = float32(0.0)
            if x < T.Bc * L.EP and c1 + c < Nk and e < L.Dv:
                vreg[u] = v[U(b), U(kh), U(c1 + c), U(e)]

    @cuda.jit(device=True, inline="always")
    def store_kv(T, L, U, sm, kreg, vreg, t):
        """The next tile, from registers into Ks, Vs."""
        for u in range(L.NK):
            x = t + u * T.threads
            if x < T.Bc * L.D:
                sm[U(L.KS + (x // L.D) * L.DP + x % L.D)] = kreg[u]
        for u in range(L.NV):
            x = t + u * T.threads
            if x < T.Bc * L.EP:
                c = x // L.EP
                e = x % L.EP
                sm[U(L.VS + c * L.EP + e)] = vreg[u]


def make_prefetch_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_padded's kernel with the register prefetch, for one Tiling and D, Dv (built once, kept)."""
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    T, L = tiling, tiling.layout(D, Dv)
    U = uint64 if tiling.unsigned else int64   # int64(x) changes nothing: numba's wraparound code stays

    @cuda.jit(**jit_options(T))
    def prefetch_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
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

        kreg = cuda.local.array(L.NK, float32)   # the next tile's K / V, a thread's share, in flight
        vreg = cuda.local.array(L.NV, float32)
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
            if has_next:                      # the change: the next tile's loads issued now, used later
                issue_kv(T, L, U, k, v, kreg, vreg, visit[tr, n + 1] * T.Bc, b, kh, t, Nk)
            scores(T, L, U, sm, s, a, bk, ty, tx)
            apply_rules(T, L, U, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
            cuda.syncthreads()                # every share written; nobody reads Ks any more
            softmax_step(T, L, U, sm, s, m, l, o, ty, tx)
            cuda.syncthreads()                # P complete
            accumulate(T, L, U, sm, o, a, pv, ty, tx)
            cuda.syncthreads()                # everyone done with Ps (= Ks) and Vs
            if has_next:                      # and stored from registers after the arithmetic
                store_kv(T, L, U, sm, kreg, vreg, t)
        finish(T, L, U, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)

    _KERNELS[key] = prefetch_forward_kernel
    return prefetch_forward_kernel
