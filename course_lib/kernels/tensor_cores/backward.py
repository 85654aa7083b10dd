"""Backward impl ``cuda_mma_f16``: chapter 12's backward on the tensor cores, float16 / bfloat16 inputs.

The algorithm is ``backward_numba_cuda``'s (FA2's: P recomputed from the stored lse, D_i = rowsum(dO_i O_i)
computed once on the host, two kernels so that dQ needs no atomics); what changes is that each of its five
tile products is ``mma.sync.m16n8k16`` (fp32 accumulation) on fragments, as the forward's are
(``forward``), and that a warp, not a thread, owns 16 rows:

- ``dkdv_kernel``: a block of ``warps`` warps owns 16 ``warps`` keys, each warp 16 of them, its K and V
  fragments in registers (A operands) for the whole kernel.  For each query tile of ``Bi`` rows of every
  query head of the group (GQA summed in the accumulators): S^T = K Q^T and dP^T = V dO^T (B from Q's and
  dO's rows in shared memory), P^T = exp(S^T - lse) and dS^T = P^T (dP^T - D) on the accumulator
  fragments (element (key, query) being ``mma.c_elem``), then dV += P^T dO and dK += dS^T Q, P^T and dS^T
  going from the accumulators straight into A fragments (rounded to the input dtype, as FA2 does), B from
  Q and dO stored transposed (a word holds two query rows of one dim).
- ``dq_kernel``: a block owns 16 ``warps`` query rows, Q and dO as A fragments; for each key tile of
  ``Bi`` keys: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K (K transposed in shared memory).

The scale multiplies dK and dQ once, at the end.  EMPTY tiles are skipped by the whole block, the mask and
the tails are applied on the fragments of PARTIAL and edge tiles, by the scalar rules every kernel shares.
A row that saw no key (lse = -inf) and the rows past Nq get lse = +inf: P = 0, a zero gradient.

On a GPU the products are inline PTX (``mma``); in numba's simulator they are ``sim``'s emulation, so
the whole kernel is checked on a machine without a GPU (small shapes) and again on the GPU
(``benchmarks/gpu_backward.py --parts check_mma``), where it is timed beside PyTorch's fp16 backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

try:
    import numba
    from numba import cuda, float32, uint32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the impl is unavailable
    numba = None

from ...core import rules
from ...core.reference import rebased_lse
from ...core.reference_backward import delta
from .. import flash_numba_cuda as ch09
from .. import launch as host
from ..cuda_steps.device import SIMULATOR, on_gpu
from ..cuda_steps.tiling import STATIC_SHARED
from .layout import HALF_A, kind_of, padded, words

if numba is not None:
    from ..cuda_steps.device import alibi_rebased_distance, softcap, visible
    from .fragments import unroll
    from .instructions import inlined, ops  # the instructions: emulated in the simulator
    softcap_slope = cuda.jit(device=True)(rules.softcap_slope)
    NEG_INF, POS_INF = float32(-math.inf), float32(math.inf)


@dataclass(frozen=True)
class BackwardTiling:
    """``warps`` warps of 16 rows own a block's rows (keys for dK / dV, queries for dQ); the other side
    comes in tiles of ``Bi`` rows (query rows for dK / dV, keys for dQ)."""

    warps: int = 4
    Bi: int = 64

    @property
    def rows(self):
        return 16 * self.warps


def shared_bytes(kind, tiling, D, Dv):
    """The larger kernel's shared memory: dK / dV's Q and dO tiles, each by rows and transposed, and lse, D."""
    Bi, dw, vw = tiling.Bi, padded(D, kind) // 2, padded(Dv, kind) // 2
    rows = Bi * (dw + 4) + Bi * (vw + 4)
    transposed = 2 * dw * (Bi // 2 + 4) + 2 * vw * (Bi // 2 + 4)
    return 4 * (rows + transposed + 2 * Bi)


def default_tiling(kind, D, Dv):
    """4 warps, the widest inner tile (64, 32 or 16 rows) whose tiles fit the 48 KB of static shared memory."""
    for Bi in (64, 32, 16):
        if shared_bytes(kind, BackwardTiling(4, Bi), D, Dv) <= STATIC_SHARED:
            return BackwardTiling(4, Bi)
    raise ValueError(f"D={D}, Dv={Dv}: even 16-row tiles take more than {STATIC_SHARED} bytes of shared memory")


def available() -> bool:
    """On a GPU (inline PTX), or in numba's simulator (the instructions emulated: ``sim``)."""
    return numba is not None and (SIMULATOR or on_gpu())


@dataclass(frozen=True)
class BackwardShape:
    """What the two kernels are compiled with, fixed by (kind, tiling, D, Dv): numba takes the counts as
    compile-time constants, each factory reading the ones it uses into locals."""

    kind: str
    tiling: BackwardTiling
    dims: int           # head dim computed (D padded: zeros added)
    out_dims: int       # value dim computed (Dv padded)
    key_words: int      # words a row of q / k
    v_words: int        # words a row of v / dO
    k_chunks: int       # 8-word k chunks of the products over D
    v_chunks: int       # and over Dv
    inner_tiles: int    # 8-column tiles of S (or S^T) over the inner tile
    inner_chunks: int   # 16-row k chunks of the products over the inner tile
    d_tiles: int        # 8-dim column tiles of dQ / dK
    o_tiles: int        # 8-dim column tiles of dV


def backward_shape(kind, tiling, D, Dv):
    """The ``BackwardShape`` of a ``kind`` backward with ``tiling`` at head dims D, Dv."""
    dims, out_dims = padded(D, kind), padded(Dv, kind)
    key_words, v_words = dims // 2, out_dims // 2
    return BackwardShape(kind, tiling, dims, out_dims, key_words, v_words, key_words // 8, v_words // 8,
                         tiling.Bi // 8, tiling.Bi // 16, dims // 8, out_dims // 8)


def make_products(shape):
    """The four tile products as unrolled device functions (a namespace): ``s_product`` (S = Q K^T, S^T =
    K Q^T), ``dp_product`` (dP = dO V^T, dP^T = V dO^T), ``d_product`` (dQ += dS K, dK += dS^T Q) and
    ``v_product`` (dV += P^T dO)."""
    mma_op = ops.mma_bf16 if shape.kind == "bf16" else ops.mma_f16
    pack = ops.pack_bf16 if shape.kind == "bf16" else ops.pack_f16
    b_word = ops.b_word_gpu
    inner_chunks = shape.inner_chunks

    def rows_times(n_chunks, n_tiles):
        """acc's fragment j += A's chunk kc (registers) times B from the rows of ``tile`` (x = kc n_tiles + j):
        S = Q K^T, dP = dO V^T and their transposes."""
        @inlined()
        def step(x, af, tile, acc, lane):
            kc, j = x // n_tiles, x % n_tiles
            n0, w0 = b_word(lane, 0)
            n1, w1 = b_word(lane, 1)
            acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3] = mma_op(
                af[kc, 0], af[kc, 1], af[kc, 2], af[kc, 3],
                tile[j * 8 + n0, kc * 8 + w0], tile[j * 8 + n1, kc * 8 + w1],
                acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3])
        return unroll(n_chunks * n_tiles, step, inlined())

    def acc_times(n_tiles):
        """acc's fragment e += the accumulators ``c``'s 16-column chunk pc as A (two 8-column fragments, each
        pair of floats rounded and packed: HALF_A) times B from the transposed ``tile`` (x = pc n_tiles + e):
        dV += P^T dO, dK += dS^T Q, dQ += dS K."""
        @inlined()
        def step(x, c, tile, acc, lane):
            pc, e = x // n_tiles, x % n_tiles
            n0, w0 = b_word(lane, 0)
            n1, w1 = b_word(lane, 1)
            acc[e, 0], acc[e, 1], acc[e, 2], acc[e, 3] = mma_op(
                pack(c[2 * pc + HALF_A[0][0], HALF_A[0][1]], c[2 * pc + HALF_A[0][0], HALF_A[0][2]]),
                pack(c[2 * pc + HALF_A[1][0], HALF_A[1][1]], c[2 * pc + HALF_A[1][0], HALF_A[1][2]]),
                pack(c[2 * pc + HALF_A[2][0], HALF_A[2][1]], c[2 * pc + HALF_A[2][0], HALF_A[2][2]]),
                pack(c[2 * pc + HALF_A[3][0], HALF_A[3][1]], c[2 * pc + HALF_A[3][0], HALF_A[3][2]]),
                tile[e * 8 + n0, pc * 8 + w0], tile[e * 8 + n1, pc * 8 + w1],
                acc[e, 0], acc[e, 1], acc[e, 2], acc[e, 3])
        return unroll(inner_chunks * n_tiles, step, inlined())

    return SimpleNamespace(s_product=rows_times(shape.k_chunks, shape.inner_tiles),
                           dp_product=rows_times(shape.v_chunks, shape.inner_tiles),
                           d_product=acc_times(shape.d_tiles), v_product=acc_times(shape.o_tiles))


def make_loads(shape):
    """(fragment, load): a warp's A fragments of 16 rows, and a block's inner tile of rows into shared memory."""
    inner, threads = shape.tiling.Bi, 32 * shape.tiling.warps
    low_halves, high_halves = ops.low_halves, ops.high_halves
    a_word = ops.a_word_gpu

    @cuda.jit(device=True)
    def fragment(src, b, h, r0, N, af, n_chunks, lane):
        """This warp's A fragments of 16 rows from r0 (zeros past N): K or V (dkdv), Q or dO (dq)."""
        for kc in range(n_chunks):
            for r in range(4):
                row, w = a_word(lane, r)
                val = uint32(0)
                if r0 + row < N:
                    val = src[b, h, r0 + row, kc * 8 + w]
                af[kc, r] = val

    @cuda.jit(device=True)
    def load(src, b, h, r0, N, rows, trans, rw, both, t):
        """Bi rows of src[b, h] from r0 (``rw`` words a row, zeros past N) into ``rows`` and, if ``both``,
        transposed into ``trans``: word (dim, p) holds rows 2p and 2p + 1 of that dim (B of a product over
        the rows)."""
        for x in range(t, (inner // 2) * rw, threads):
            p = x // rw
            w = x % rw
            lo = uint32(0)
            hi = uint32(0)
            if r0 + 2 * p < N:
                lo = src[b, h, r0 + 2 * p, w]
            if r0 + 2 * p + 1 < N:
                hi = src[b, h, r0 + 2 * p + 1, w]
            rows[2 * p, w] = lo
            rows[2 * p + 1, w] = hi
            if both:
                trans[2 * w, p] = low_halves(lo, hi)
                trans[2 * w + 1, p] = high_halves(lo, hi)
    return fragment, load


if numba is not None:
    @cuda.jit(device=True)
    def row_stats(lse, dsum, b, h, i, Nq):
        """(lse, D) of query row i; lse = +inf for a row past Nq or one that saw no key: P = 0 there."""
        lv, dv_ = POS_INF, float32(0.0)
        if i < Nq:
            lv, dv_ = lse[b, h, i], dsum[b, h, i]
            if lv == NEG_INF:
                lv = POS_INF
        return lv, dv_

    @cuda.jit(device=True)
    def grad(s, dp, lse_i, d_i, i, j, edge, Nq, Nk, scale, cap, alibi, slope, offset, left, right):
        """(p, ds) of query row i and key j from the raw score s and dp = dO_i . v_j: the forward's rules."""
        t_ = float32(softcap(s * scale, cap))
        sc = t_
        if alibi:
            sc -= slope * float32(alibi_rebased_distance(i, j, offset, Nk))
        if edge and (i >= Nq or j >= Nk or not visible(i, j, offset, left, right)):
            return float32(0.0), float32(0.0)
        p = float32(math.exp(sc - lse_i))
        ds = p * (dp - d_i)
        if cap > 0:
            ds *= float32(softcap_slope(t_, cap))
        return p, ds


def make_dkdv_kernel(shape):
    """dK and dV: a block of ``warps`` warps owns 16 ``warps`` keys, their K and V fragments in registers;
    for each query tile of every query head of the group, S^T and dP^T, then dV += P^T dO, dK += dS^T Q."""
    inner, rows, threads = shape.tiling.Bi, shape.tiling.rows, 32 * shape.tiling.warps
    dims, out_dims, key_words, v_words = shape.dims, shape.out_dims, shape.key_words, shape.v_words
    k_chunks, v_chunks, inner_tiles = shape.k_chunks, shape.v_chunks, shape.inner_tiles
    d_tiles, o_tiles = shape.d_tiles, shape.o_tiles
    k_stride, v_stride, t_stride = key_words + 4, v_words + 4, inner // 2 + 4   # shared rows padded by 4 words
    c_elem = ops.c_elem_gpu
    products = make_products(shape)
    s_product, dp_product, d_product, v_product = (products.s_product, products.dp_product, products.d_product,
                                                   products.v_product)
    fragment, load = make_loads(shape)

    @cuda.jit(fastmath=True)
    def dkdv_kernel(q, k, v, dout, lse, dsum, tiles, group, scale, cap, alibi, slopes, offset, left, right,
                    dk, dv):
        """grid (Tc, B * Hk), 32 warps threads; words in, dk, dv (B, Hk, Nk, D / Dv) float32 out."""
        Nq, Nk, Hk = q.shape[2], k.shape[2], k.shape[1]
        tc = cuda.blockIdx.x
        b = cuda.blockIdx.y // Hk
        kh = cuda.blockIdx.y % Hk
        t = cuda.threadIdx.x
        lane = t % 32
        key0 = tc * rows + 16 * (t // 32)            # this warp's first key
        qs = cuda.shared.array((inner, k_stride), uint32)
        qt = cuda.shared.array((dims, t_stride), uint32)
        os_ = cuda.shared.array((inner, v_stride), uint32)
        ot = cuda.shared.array((out_dims, t_stride), uint32)
        ls = cuda.shared.array(inner, float32)
        dls = cuda.shared.array(inner, float32)
        kf = cuda.local.array((k_chunks, 4), uint32)
        vf = cuda.local.array((v_chunks, 4), uint32)
        fragment(k, b, kh, key0, Nk, kf, k_chunks, lane)
        fragment(v, b, kh, key0, Nk, vf, v_chunks, lane)
        dka = cuda.local.array((d_tiles, 4), float32)
        dva = cuda.local.array((o_tiles, 4), float32)
        st = cuda.local.array((inner_tiles, 4), float32)
        dpt = cuda.local.array((inner_tiles, 4), float32)
        for e in range(d_tiles):
            for r in range(4):
                dka[e, r] = float32(0.0)
        for e in range(o_tiles):
            for r in range(4):
                dva[e, r] = float32(0.0)
        for g in range(group):
            h = kh * group + g
            slope = float32(slopes[b, h])
            for tr in range(tiles.shape[0]):
                code = tiles[tr, tc]
                if code == rules.EMPTY:
                    continue
                q0 = tr * inner
                cuda.syncthreads()                 # nobody reads the last query tile any more
                load(q, b, h, q0, Nq, qs, qt, key_words, True, t)
                load(dout, b, h, q0, Nq, os_, ot, v_words, True, t)
                for x in range(t, inner, threads):
                    ls[x], dls[x] = row_stats(lse, dsum, b, h, q0 + x, Nq)
                cuda.syncthreads()
                for j in range(inner_tiles):
                    for r in range(4):
                        st[j, r] = float32(0.0)
                        dpt[j, r] = float32(0.0)
                s_product(kf, qs, st, lane)        # S^T = K Q^T
                dp_product(vf, os_, dpt, lane)     # dP^T = V dO^T
                edge = code == rules.PARTIAL or q0 + inner > Nq or tc * rows + rows > Nk
                for j in range(inner_tiles):
                    for r in range(4):
                        row, col = c_elem(lane, r)
                        x = j * 8 + col
                        st[j, r], dpt[j, r] = grad(st[j, r], dpt[j, r], ls[x], dls[x], q0 + x, key0 + row, edge,
                                                   Nq, Nk, scale, cap, alibi, slope, offset, left, right)
                v_product(st, ot, dva, lane)       # dV += P^T dO
                d_product(dpt, qt, dka, lane)      # dK += dS^T Q
        for r in range(4):
            row, col = c_elem(lane, r)
            j = key0 + row
            if j < Nk:
                for e in range(d_tiles):
                    if e * 8 + col < dk.shape[3]:
                        dk[b, kh, j, e * 8 + col] = dka[e, r] * scale
                for e in range(o_tiles):
                    if e * 8 + col < dv.shape[3]:
                        dv[b, kh, j, e * 8 + col] = dva[e, r]
    return dkdv_kernel


def make_dq_kernel(shape):
    """dQ: a block owns 16 ``warps`` query rows, Q and dO as A fragments; for each key tile, S = Q K^T,
    dP = dO V^T, dS = P (dP - D), dQ += dS K (K transposed in shared memory)."""
    inner, rows = shape.tiling.Bi, shape.tiling.rows
    dims, key_words, v_words = shape.dims, shape.key_words, shape.v_words
    k_chunks, v_chunks, inner_tiles, d_tiles = shape.k_chunks, shape.v_chunks, shape.inner_tiles, shape.d_tiles
    k_stride, v_stride, t_stride = key_words + 4, v_words + 4, inner // 2 + 4   # shared rows padded by 4 words
    c_elem = ops.c_elem_gpu
    products = make_products(shape)
    s_product, dp_product, d_product = products.s_product, products.dp_product, products.d_product
    fragment, load = make_loads(shape)

    @cuda.jit(fastmath=True)
    def dq_kernel(q, k, v, dout, lse, dsum, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right, dq):
        """grid (Tr, B * H), 32 warps threads; words in, dq (B, H, Nq, D) float32 out."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        tr = cuda.blockIdx.x
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        kh = kv_head[h]
        t = cuda.threadIdx.x
        lane = t % 32
        row0 = tr * rows + 16 * (t // 32)            # this warp's first query row
        ks = cuda.shared.array((inner, k_stride), uint32)
        kt = cuda.shared.array((dims, t_stride), uint32)
        vs = cuda.shared.array((inner, v_stride), uint32)
        qf = cuda.local.array((k_chunks, 4), uint32)
        of = cuda.local.array((v_chunks, 4), uint32)
        fragment(q, b, h, row0, Nq, qf, k_chunks, lane)
        fragment(dout, b, h, row0, Nq, of, v_chunks, lane)
        l0, d0 = row_stats(lse, dsum, b, h, row0 + lane // 4, Nq)        # the lane's rows g and g + 8
        l1, d1 = row_stats(lse, dsum, b, h, row0 + lane // 4 + 8, Nq)
        slope = float32(slopes[b, h])
        dqa = cuda.local.array((d_tiles, 4), float32)
        s = cuda.local.array((inner_tiles, 4), float32)
        dp = cuda.local.array((inner_tiles, 4), float32)
        for e in range(d_tiles):
            for r in range(4):
                dqa[e, r] = float32(0.0)
        for tc in range(tiles.shape[1]):
            code = tiles[tr, tc]
            if code == rules.EMPTY:
                continue
            c0 = tc * inner
            cuda.syncthreads()
            load(k, b, kh, c0, Nk, ks, kt, key_words, True, t)
            load(v, b, kh, c0, Nk, vs, kt, v_words, False, t)
            cuda.syncthreads()
            for j in range(inner_tiles):
                for r in range(4):
                    s[j, r] = float32(0.0)
                    dp[j, r] = float32(0.0)
            s_product(qf, ks, s, lane)             # S = Q K^T
            dp_product(of, vs, dp, lane)           # dP = dO V^T
            edge = code == rules.PARTIAL or c0 + inner > Nk or tr * rows + rows > Nq
            for j in range(inner_tiles):
                for r in range(4):
                    row, col = c_elem(lane, r)
                    lv, dl = (l0, d0) if r < 2 else (l1, d1)
                    p, s[j, r] = grad(s[j, r], dp[j, r], lv, dl, row0 + row, c0 + j * 8 + col, edge,
                                      Nq, Nk, scale, cap, alibi, slope, offset, left, right)
            d_product(s, kt, dqa, lane)            # dQ += dS K
        for r in range(4):
            row, col = c_elem(lane, r)
            i = row0 + row
            if i < Nq:
                for e in range(d_tiles):
                    if e * 8 + col < dq.shape[3]:
                        dq[b, h, i, e * 8 + col] = dqa[e, r] * scale
    return dq_kernel


_KERNELS = {}


def make_kernels(kind: str, tiling: BackwardTiling, D: int, Dv: int):
    """(dkdv_kernel, dq_kernel) for ``kind`` ("f16" or "bf16"), built once per shape."""
    key = (kind, tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    if kind not in ("f16", "bf16"):
        raise ValueError(f"the tensor-core backward takes halves (kind f16 or bf16), got {kind!r}")
    if tiling.Bi % 16 or shared_bytes(kind, tiling, D, Dv) > STATIC_SHARED:
        raise ValueError(f"{tiling} at D={D}, Dv={Dv}: Bi must be a multiple of 16 and the tiles must fit "
                         f"{STATIC_SHARED} bytes of shared memory (they take {shared_bytes(kind, tiling, D, Dv)})")
    shape = backward_shape(kind, tiling, D, Dv)
    _KERNELS[key] = (make_dkdv_kernel(shape), make_dq_kernel(shape))
    return _KERNELS[key]


def plan(q, k, v, opts, mask, tiling=None):
    """(dkdv kernel, dq kernel, grid of each, threads, the arguments of each between the tensors and the
    outputs): each kernel's tile table from ``launch.prepare`` with its own tile sizes."""
    kind = kind_of("mma_f16", q.dtype)
    B, H, Nq, D = q.shape
    Hk, Dv = k.shape[1], v.shape[3]
    tiling = tiling or default_tiling(kind, D, Dv)
    if opts.block_q is not None or opts.block_k is not None:
        raise ValueError("the tensor-core backward chooses its own tiles (tiling=BackwardTiling(...)), "
                         "not block_q / block_k")
    dkdv, dq = make_kernels(kind, tiling, D, Dv)
    empty = (q[:, :, :0], k[:, :, :0], v[:, :, :0])
    by_keys = host.prepare(*empty, opts, mask, tiling.Bi, tiling.rows)[0]       # query tiles x key blocks
    by_rows = host.prepare(*empty, opts, mask, tiling.rows, tiling.Bi)[0]       # query blocks x key tiles
    common = (np.float32(by_keys.softmax_scale), np.float32(by_keys.softcap), by_keys.alibi,
              by_keys.slopes.astype(np.float32), by_keys.offset, by_keys.left, by_keys.right)
    args_kv = (by_keys.tiles, H // Hk, *common)
    args_q = (by_rows.tiles, by_rows.kv_head.astype(np.int32), *common)
    return (dkdv, dq, (by_keys.tiles.shape[1], B * Hk), (by_rows.tiles.shape[0], B * H), 32 * tiling.warps,
            args_kv, args_q, kind)


def launcher(q, k, v, out, lse, dout, opts, mask, tiling=None):
    """(a zero-argument callable running both kernels on device arrays, dq, dk, dv on the device): inputs
    converted to words and copied once (D_i computed here, in float32), so a timing loop times the kernels."""
    dkdv, dq_k, grid_kv, grid_q, threads, args_kv, args_q, kind = plan(q, k, v, opts, mask, tiling)
    dsum = delta(dout, out, np.float32).astype(np.float32)
    ins = tuple(cuda.to_device(words(x, kind)) for x in (q, k, v, dout))
    lse = rebased_lse(lse, opts, mask)                              # the kernels' scores are rebased
    ins += tuple(cuda.to_device(np.ascontiguousarray(x, np.float32)) for x in (lse, dsum))
    dev = lambda args: tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    dargs_kv, dargs_q = dev(args_kv), dev(args_q)
    dq = cuda.to_device(np.full(q.shape, np.nan, np.float32))       # poisoned: a gradient nobody wrote shows
    dk = cuda.to_device(np.full(k.shape, np.nan, np.float32))
    dv = cuda.to_device(np.full(v.shape, np.nan, np.float32))
    run_kv, run_q = dkdv[grid_kv, threads], dq_k[grid_q, threads]

    def go():
        run_kv(*ins, *dargs_kv, dk, dv)
        run_q(*ins, *dargs_q, dq)
    return go, dq, dk, dv


def attention_backward(q, k, v, out, lse, dout, opts, mask, tiling=None):
    """(dq, dk, dv) in q's dtype for validated dense float16 / bfloat16 inputs (an ``attention_backward``)."""
    if not available():
        raise RuntimeError("the tensor-core backward runs on a GPU, or in numba's simulator (NUMBA_ENABLE_CUDASIM=1)")
    B, H, Nq, D = q.shape
    if not on_gpu() and B * H * Nq * k.shape[2] * (D + v.shape[3]) > ch09.sim_max_work():
        raise ValueError(f"the simulator takes only small problems (B*H*Nq*Nk*(D+Dv) <= {ch09.sim_max_work()})")
    go, dq, dk, dv = launcher(q, k, v, out, lse, dout, opts, mask, tiling)
    go()
    return tuple(g.copy_to_host().astype(q.dtype) for g in (dq, dk, dv))
