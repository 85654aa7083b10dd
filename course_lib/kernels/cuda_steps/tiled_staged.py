"""Step ``tiled_staged`` (and ``tuned``): ``tiled_vec4`` with every K / V load of a tile in flight at once.

``tiled_vec4`` leaves the batching of its element-by-element loads to the
compiler, which at D=128 unrolls them only 8 deep: 8 trips to memory per tile,
with the SM's one block waiting at each.  Here every load of tile n + 1 is
issued into registers (``kreg``, ``vreg``) before the first is stored, while
tile n is computed, at flat offsets (constants folded into the load
instructions).  The rest is ``tiled_vec4``'s kernel (``aligned_kernel``), from
the same device functions.  ``tuned`` is this kernel with the tile sizes and
threads per block that ``tuning.autotune`` picked per head dim.
"""
from __future__ import annotations

try:
    from numba import cuda, float32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from .device import SIMULATOR, jit_options, tile_slot
from .tiling import Tiling

_KERNELS = {}

if cuda is not None:
    from .tiled_vec4 import (
        U,
        accumulate,
        apply_rules,
        finish_shuffle,
        load_q,
        row_max_shuffle,
        scores,
        softmax_step,
        start,
    )

    @cuda.jit(device=True, inline="always")
    def store_kv(T, L, sm, kreg, vreg, t, kc, kd, vc, ve):
        """The staged K / V tile from registers into Ks, Vs."""
        for u in range(L.NK):
            c, d, ok = tile_slot(T, L.D4, u, t, kc, kd)
            if ok:
                sm[U(L.KS + c * L.DP + d)] = kreg[u]
        for u in range(L.NV):
            c, e, ok = tile_slot(T, L.EP, u, t, vc, ve)
            if ok:
                sm[U(L.VS + c * L.EP + e)] = vreg[u]

    @cuda.jit(device=True, inline="always")
    def stage_kv(T, L, k, v, kreg, vreg, c1, b, kh, Hk, t, kc, kd, vc, ve, Nk):
        """Every load of the key tile at c1 issued into kreg, vreg (zeros past Nk, D and Dv).

        On the GPU an element is read at its flat offset, k[0, 0, 0, x]: the arrays are C-contiguous
        (the address is just data + 4 x) and numba checks no bounds there, so the offsets of a thread's
        NK loads differ by constants the compiler folds into the load instructions, instead of a 64-bit
        multiply by a run-time shape each."""
        kflat = ((b * Hk + kh) * Nk + c1) * L.D
        vflat = ((b * Hk + kh) * Nk + c1) * L.Dv
        for u in range(L.NK):
            c, d, ok = tile_slot(T, L.D4, u, t, kc, kd)
            val = float32(0.0)
            if ok and c1 + c < Nk and (L.D4 == L.D or d < L.D):
                if SIMULATOR:             # the simulator's arrays check their bounds
                    val = k[U(b), U(kh), U(c1 + c), U(d)]
                else:
                    val = k[0, 0, 0, U(kflat + c * L.D + d)]
            kreg[u] = val
        for u in range(L.NV):
            c, e, ok = tile_slot(T, L.EP, u, t, vc, ve)
            val = float32(0.0)
            if ok and c1 + c < Nk and (L.EP == L.Dv or e < L.Dv):
                if SIMULATOR:
                    val = v[U(b), U(kh), U(c1 + c), U(e)]
                else:
                    val = v[0, 0, 0, U(vflat + c * L.Dv + e)]
            vreg[u] = val


def make_staged_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_vec4's kernel with K / V staged through registers a tile ahead (built once, kept)."""
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    T, L = tiling, tiling.layout(D, Dv)

    @cuda.jit(**jit_options(T))
    def staged_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                      out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)."""
        H, Nq, Nk, Hk = q.shape[1], q.shape[2], k.shape[2], k.shape[1]
        b = cuda.blockIdx.x // H
        h = cuda.blockIdx.x % H
        tr = cuda.gridDim.y - 1 - cuda.blockIdx.y     # the last query tiles (the longest rows) first
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % T.tx
        ty = t // T.tx
        row0 = tr * T.Br
        if SIMULATOR:                 # the simulator takes no alignment (and needs none)
            sm = cuda.shared.array(0, float32)
        else:
            sm = cuda.shared.array(0, float32, alignment=16)
        slope = float32(slopes[b, h])

        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)
        load_q(T, L, q, sm, scale, b, h, row0, t, Nq)

        kreg = cuda.local.array(L.NK, float32)
        vreg = cuda.local.array(L.NV, float32)
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
        # K and V go through registers, every load of a tile issued before the first of them is
        # needed (one trip to memory per tile, not one per element), tile n + 1's loads in flight
        # while tile n is computed; iteration first - 1 only issues the first tile's.
        for n in range(first - 1, last):
            if n >= first:
                cuda.syncthreads()            # nobody reads the last tile's Ks, Vs, Ps any more
                store_kv(T, L, sm, kreg, vreg, t, kc, kd, vc, ve)
            if n + 1 < last:
                stage_kv(T, L, k, v, kreg, vreg, visit[tr, n + 1] * T.Bc, b, kh, Hk, t, kc, kd, vc, ve, Nk)
            if n < first:
                continue
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * T.Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete
            scores(T, L, sm, s, qa, kb, ty, tx)
            apply_rules(T, L, sm, s, kind, c0, row0, ty, tx, Nk, cap, alibi, slope, offset, left, right)
            row_max_shuffle(T, L, sm, s, rmax, ty, tx)
            softmax_step(T, L, sm, s, rmax, m, l, o, ty, tx)
            cuda.syncthreads()                # P complete
            accumulate(T, L, sm, o, qa, vb, ty, tx)
        finish_shuffle(T, L, sm, m, l, o, out, lse, split, b, h, row0, ty, tx, Nq)

    _KERNELS[key] = staged_kernel
    return staged_kernel
