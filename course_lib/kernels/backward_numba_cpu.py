"""Backward impls ``flash_numba_cpu`` and ``flash_numba_cpu_dq_pass``: the tiled backward, compiled.

Chapter 12's compiled kernel: ``backward_numpy``'s FA2 loop order with Numba,
built the way chapter 08 built the forward: every tile matmul is one BLAS call
on contiguous tiles inside njit (SciPy's BLAS, one thread inside each of
prange's: ``cpu_steps.scipy_openblas``), the tiles are views of q, k, v
and dO where they lie (``load_tile``: no copy), and the exponentials are
chapter 08's vectorised ``exp_row``.  S and dP are ``np.dot``; the three
matmuls that accumulate (into dVj, dKj, dQi) are ``blas_add.dot_add``, gemm
with beta = 1, which adds inside the matmul instead of writing a scratch tile
and adding it in a second pass (measured: 4 % of the time on one core).

``prange`` runs over the (batch, head, key tile) work items, heaviest first
(under a causal mask the early key tiles are seen by almost every query) and
handed out one at a time, as the forward's ``balanced`` step does.  Item j
owns dKj and dVj (in a per-query-head buffer, so GQA heads never share a row;
the host sums each group afterwards), so no two threads write one element of
dK or dV.  dQ is the hard part: every key tile adds to every dQi it sees, so
items of different key tiles would race on dQi.  Two race-free answers, both
registered so that they can be measured against each other:

- ``partials`` (impl ``flash_numba_cpu``): each thread adds into its own copy
  of dQ (``numba.get_thread_id()`` picks it; one copy per thread, O(N) each),
  and the host sums the copies at the end;
- ``second_pass`` (impl ``flash_numba_cpu_dq_pass``): the key-tile pass
  computes only dK and dV; a second prange over (batch, head, query tile)
  recomputes Pij and dSij and accumulates dQi on its own, so each item owns
  its rows of dQ.  It recomputes S and dP twice: 7 tile matmuls instead of 5.

The softmax scale is folded into Q once, on the host (Q' = scale Q): then
S = Q'i Kj^T is the scaled score and dKj += dSij^T Q'i already carries dK's
scale; dQ's is applied once at the end.  Per tile, with P recomputed from the
stored lse, the key pass holds the tile transposed (Bc x Br, a row per key):
S^T = Kj Q'i^T, dP^T = Vj dOi^T, then row by row softcap, ALiBi and the mask
of a PARTIAL tile (two index bounds per row, as the forward's ``rowvec``
step, the window's sides swapped: seen from a key), P^T = exp(S^T - lse),
dS^T = P^T (dP^T - D) times softcap's slope (``rules.softcap_slope``); then
dVj += P^T dOi and dKj += dS^T Q'i take their tile as it lies, and only
dQi += dS Kj takes one transposed.  Untransposed (S = Q'i Kj^T, a row per
query), two of the three accumulating matmuls took a transposed tile, and
those ran slower (benchmarks/backward.py's ``backward_phases`` times both:
one head at d = 64 on one core, the five matmuls about 3 % faster this way).
The second pass (``query_tile``) keeps the row per query: its one
accumulating matmul, dQi += dS Kj, takes dS as it lies.  D = rowsum(dO * O)
is computed first (FA2's first pass, ``row_delta``).  Which tiles to skip is the host's plan (``launch.prepare``), as in the
forward.  Precision follows ``rules``: float32 accumulation (float64 for
float64), P and dS rounded to the input dtype before their matmuls at
float16 / bfloat16.  The passes around the key tiles (D, and the merge and
scale of the threads' dQ) are prange loops too: numpy would run them on one
core, through temporaries (measured at d = 64: about 30 ms of the first
0.5 s call through numpy, 10 through these).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ..core import rules
from ..core.reference import rebased_lse
from ..core.reference_backward import sum_groups
from . import launch as host
from .cpu_steps.host import scipy_openblas
from .cpu_steps.tile import FASTMATH

DQ_MODES = ("partials", "second_pass")
# (Br, Bc) when the call gives none, from ``benchmarks/backward.py --tiles`` on this machine (chapter 12
# prints the sweep).  With every tile full, larger tiles run the matmuls faster; under a mask the
# diagonal's partly hidden tiles grow with Bc, and fewer, larger work items balance worse over the cores.
TILES = {"full": (256, 512), "masked": (128, 256)}


def default_tiles(mask):
    """(Br, Bc) for a call that gives none: ``TILES``' for this mask (a mask that hides nothing is "full")."""
    return TILES["full" if mask.is_trivial else "masked"]


def available() -> bool:
    return numba is not None


if numba is not None:
    from .blas_add import dot_add
    from .cpu_steps.tile import (
        alibi_anchor,
        alibi_rebased_distance,
        alibi_row,
        exp_row,
        exp_row_shifted,
        hide_outside_window,
        round_to_bits,
        shift_of,
        softcap,
    )

    softcap_slope = numba.njit(cache=True)(rules.softcap_slope)

    @numba.njit(cache=True)
    def load_tile(x, b, h, start, stop):
        """Rows [start, stop) of head h of batch b of x: the tile, read where it lies (a view, no copy)."""
        return x[b, h, start:stop]

    @numba.njit(cache=True, fastmath=FASTMATH)
    def softcap_row(row, G_row, n, cap):
        """Softcap a row of scores in place, keeping its slope (for dS) in G_row: either tile's orientation."""
        for c in range(n):
            t = softcap(row[c], cap)
            row[c] = t
            G_row[c] = softcap_slope(t, cap)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def finish_ds_row(P_row, dS_row, G_row, n, cap, round_bits, round_min_exponent):
        """The rest of a row of dS once P (dP - D) is in place: softcap's slope, then P and dS as the matrix
        unit takes them (rounded to float16 / bfloat16 for those inputs)."""
        dtype = P_row.dtype.type
        if cap > 0:
            for c in range(n):
                dS_row[c] *= G_row[c]
        if round_bits > 0:
            for c in range(n):
                P_row[c] = dtype(round_to_bits(P_row[c], round_bits, round_min_exponent))
                dS_row[c] = dtype(round_to_bits(dS_row[c], round_bits, round_min_exponent))

    @numba.njit(cache=True, fastmath=FASTMATH)
    def scores_to_p(S, G, lse, b, h, i0, j0, kind, cap, alibi, slope, offset, Nk, left, right, fast_exp,
                    exponent_bits):
        """S (scaled scores of rows i0.., keys j0..) -> P = exp(S - lse_i) in place, row by row;
        G = softcap's slope.  The mask of a PARTIAL tile: the row's keys outside its window are -inf.
        With ALiBi, S and lse are both rebased (``core.reference.rebased_lse``)."""
        n_r, n_c = S.shape
        dtype = S.dtype.type
        for r in range(n_r):
            i = i0 + r
            row = S[r]
            if cap > 0:
                softcap_row(row, G[r], n_c, cap)
            if alibi:
                alibi_row(row, n_c, alibi_anchor(i, offset, Nk) - j0, slope)
            if kind == rules.PARTIAL:             # keys j0 + c outside the row's window are -inf
                hide_outside_window(row, n_c, i + offset - j0, left, right)
            shift = dtype(shift_of(lse[b, h, i]))   # a row that sees no key: every s is -inf, P = 0
            if fast_exp:
                exp_row(row, n_c, shift, exponent_bits)
            else:
                for c in range(n_c):
                    row[c] = math.exp(row[c] - shift)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def p_to_ds(P, dP, G, Dsum, b, h, i0, cap, round_bits, round_min_exponent):
        """dP -> dS = P (dP - Di) (times softcap's slope) in place; then P and dS as the matrix unit
        takes them (rounded to float16 / bfloat16 for those inputs)."""
        n_r, n_c = P.shape
        for r in range(n_r):
            Di = Dsum[b, h, i0 + r]
            for c in range(n_c):
                dP[r, c] = P[r, c] * (dP[r, c] - Di)
            finish_ds_row(P[r], dP[r], G[r], n_c, cap, round_bits, round_min_exponent)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def scores_to_pt(ST, G, lse, b, h, i0, j0, kind, cap, alibi, slope, offset, Nk, left, right, fast_exp,
                     exponent_bits, shifts):
        """``scores_to_p`` on the transposed tile: ST[c, r] is the score of query i0 + r against key j0 + c,
        so a row is one key and its columns are queries.  Seen from key j, query i is visible for
        i + offset - left <= j <= i + offset + right: the window of a key row, centred on j - offset - i0,
        has the query's sides swapped; each column subtracts its own row's lse."""
        n_c, n_r = ST.shape
        dtype = ST.dtype.type
        for r in range(n_r):                                   # the shifts of the tile's query rows, once
            shifts[r] = dtype(shift_of(lse[b, h, i0 + r]))     # a row that sees no key: every s is -inf, P = 0
        for c in range(n_c):
            j = j0 + c
            row = ST[c]
            if cap > 0:
                softcap_row(row, G[c], n_r, cap)
            if alibi:                              # each query its own anchor: no row-wide centre
                for r in range(n_r):
                    row[r] -= dtype(slope * alibi_rebased_distance(i0 + r, j, offset, Nk))
            if kind == rules.PARTIAL:              # queries i0 + r that cannot see key j are -inf
                hide_outside_window(row, n_r, j - offset - i0, right, left)
            if fast_exp:
                exp_row_shifted(row, n_r, shifts, exponent_bits)
            else:
                for r in range(n_r):
                    row[r] = math.exp(row[r] - shifts[r])

    @numba.njit(cache=True, fastmath=FASTMATH)
    def pt_to_dst(PT, dPT, G, Dsum, b, h, i0, cap, round_bits, round_min_exponent):
        """``p_to_ds`` on the transposed tile: dS^T[c, r] = P^T[c, r] (dP^T[c, r] - D_{i0 + r})."""
        n_c, n_r = PT.shape
        D = Dsum[b, h, i0:i0 + n_r]
        for c in range(n_c):
            for r in range(n_r):
                dPT[c, r] = PT[c, r] * (dPT[c, r] - D[r])
            finish_ds_row(PT[c], dPT[c], G[c], n_r, cap, round_bits, round_min_exponent)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def key_tile(q, k, v, dout, lse, Dsum, b, h, kh, c0, tiles_col, Br, Bc, cap, alibi, slope, offset,
                 left, right, round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv):
        """One work item: dKj, dVj of key rows [c0, c0 + Bc) of (b, h) and, ``with_dq``, its share of dQ.

        q is Q' = scale Q.  The buffers are this item's, made once, outside the loop over query tiles."""
        Nq, D, Nk, Dv = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
        c1 = min(c0 + Bc, Nk)
        n_c = c1 - c0
        S_flat = np.empty(Br * n_c, q.dtype)     # scores, then P
        dP_flat = np.empty(Br * n_c, q.dtype)    # dP, then dS
        G_flat = np.ones(Br * n_c, q.dtype)      # softcap's slope
        dKj = np.zeros((n_c, D), q.dtype)        # on chip for the whole inner loop
        dVj = np.zeros((n_c, Dv), q.dtype)
        exponent_bits = np.empty(Br, np.int32)
        shifts = np.empty(Br, q.dtype)
        tid = numba.get_thread_id()
        Kj, Vj = load_tile(k, b, kh, c0, c1), load_tile(v, b, kh, c0, c1)
        for tr in range(tiles_col.shape[0]):      # inner: the query tiles that see this key tile
            kind = tiles_col[tr]
            if kind == rules.EMPTY:
                continue
            r0 = tr * Br
            r1 = min(r0 + Br, Nq)
            n_r = r1 - r0
            Qi, dOi = load_tile(q, b, h, r0, r1), load_tile(dout, b, h, r0, r1)
            # The tile transposed (a row per key): P^T and dS^T come out as dVj and dKj take them, so
            # two of the three accumulating matmuls read an untransposed tile (measured faster on one core)
            PT = S_flat[:n_r * n_c].reshape((n_c, n_r))
            dST = dP_flat[:n_r * n_c].reshape((n_c, n_r))
            G = G_flat[:n_r * n_c].reshape((n_c, n_r))
            np.dot(Kj, Qi.T, PT)                                   # S^T = Kj Q'i^T
            np.dot(Vj, dOi.T, dST)                                 # dP^T = Vj dOi^T
            scores_to_pt(PT, G, lse, b, h, r0, c0, kind, cap, alibi, slope, offset, Nk, left, right, fast_exp,
                         exponent_bits, shifts)
            pt_to_dst(PT, dST, G, Dsum, b, h, r0, cap, round_bits, round_min_exponent)
            dot_add(PT, dOi, dVj)                                  # dVj += Pij^T dOi
            dot_add(dST, Qi, dKj)                                  # dKj += dSij^T Q'i
            if with_dq:                                            # this thread's copy of dQi += dSij Kj
                dot_add(dST.T, Kj, load_tile(dq[tid], b, h, r0, r1))
        load_tile(dk, b, h, c0, c1)[:] = dKj      # dKj, dVj written once
        load_tile(dv, b, h, c0, c1)[:] = dVj

    @numba.njit(cache=True, fastmath=FASTMATH)
    def query_tile(q, k, v, dout, lse, Dsum, b, h, kh, r0, tiles_row, Br, Bc, cap, alibi, slope, offset,
                   left, right, round_bits, round_min_exponent, fast_exp, dq):
        """The second pass: dQi of query rows [r0, r0 + Br) of (b, h), recomputing Pij and dSij."""
        Nq, D, Nk = q.shape[2], q.shape[3], k.shape[2]
        r1 = min(r0 + Br, Nq)
        n_r = r1 - r0
        S_flat = np.empty(n_r * Bc, q.dtype)
        dP_flat = np.empty(n_r * Bc, q.dtype)
        G_flat = np.ones(n_r * Bc, q.dtype)
        dQi = np.zeros((n_r, D), q.dtype)
        exponent_bits = np.empty(Bc, np.int32)
        Qi, dOi = load_tile(q, b, h, r0, r1), load_tile(dout, b, h, r0, r1)
        for tc in range(tiles_row.shape[0]):
            kind = tiles_row[tc]
            if kind == rules.EMPTY:
                continue
            c0 = tc * Bc
            c1 = min(c0 + Bc, Nk)
            n_c = c1 - c0
            Kj, Vj = load_tile(k, b, kh, c0, c1), load_tile(v, b, kh, c0, c1)
            P = S_flat[:n_r * n_c].reshape((n_r, n_c))
            dS = dP_flat[:n_r * n_c].reshape((n_r, n_c))
            G = G_flat[:n_r * n_c].reshape((n_r, n_c))
            np.dot(Qi, Kj.T, P)
            np.dot(dOi, Vj.T, dS)
            scores_to_p(P, G, lse, b, h, r0, c0, kind, cap, alibi, slope, offset, Nk, left, right, fast_exp,
                        exponent_bits)
            p_to_ds(P, dS, G, Dsum, b, h, r0, cap, round_bits, round_min_exponent)
            dot_add(dS, Kj, dQi)                                   # dQi += dSij Kj
        load_tile(dq, b, h, r0, r1)[:] = dQi

    @numba.njit(cache=True, parallel=True)
    def key_pass(q, k, v, dout, lse, Dsum, items, tiles, kv_head, Br, Bc, cap, alibi, slopes, offset, left,
                 right, round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv):
        """Every (batch, head, key tile) item of ``items`` over the cores, in its order."""
        for n in numba.prange(items.shape[0]):
            b, h, t = items[n, 0], items[n, 1], items[n, 2]
            key_tile(q, k, v, dout, lse, Dsum, b, h, kv_head[h], t * Bc, tiles[:, t], Br, Bc,
                     q.dtype.type(cap), alibi, slopes[b, h], offset, left, right,
                     round_bits, round_min_exponent, fast_exp, with_dq, dq, dk, dv)

    @numba.njit(cache=True, parallel=True)
    def query_pass(q, k, v, dout, lse, Dsum, items, tiles, kv_head, Br, Bc, cap, alibi, slopes, offset, left,
                   right, round_bits, round_min_exponent, fast_exp, dq):
        """Every (batch, head, query tile) item: each owns its rows of dQ."""
        for n in numba.prange(items.shape[0]):
            b, h, t = items[n, 0], items[n, 1], items[n, 2]
            query_tile(q, k, v, dout, lse, Dsum, b, h, kv_head[h], t * Br, tiles[t], Br, Bc,
                       q.dtype.type(cap), alibi, slopes[b, h], offset, left, right,
                       round_bits, round_min_exponent, fast_exp, dq)

    @numba.njit(cache=True, parallel=True, fastmath=FASTMATH)
    def row_delta(dout, out, Dsum):
        """Pass 1 over the cores: Dsum[b, h, i] = rowsum(dO_i * O_i), in one read of each (no temporaries)."""
        B, H, Nq, Dv = out.shape
        for n in numba.prange(B * H):
            b, h = n // H, n % H
            for i in range(Nq):
                total = Dsum.dtype.type(0)
                for c in range(Dv):
                    total += dout[b, h, i, c] * out[b, h, i, c]
                Dsum[b, h, i] = total

    @numba.njit(cache=True, parallel=True)
    def merge_dq(parts, scale, dq):
        """dQ = scale (the threads' copies summed), over the cores."""
        B, H = dq.shape[:2]
        for n in numba.prange(B * H):
            b, h = n // H, n % H
            tile = dq[b, h]
            tile[:] = parts[0, b, h]
            for t in range(1, parts.shape[0]):
                tile += parts[t, b, h]
            tile *= scale

    @numba.njit(cache=True, fastmath=FASTMATH)
    def recompute_only_tile(q, k, lse, b, h, kh, c0, tiles_col, Br, Bc, cap, alibi, slope,
                            offset, left, right, fast_exp):
        """What the backward pays for not storing P, alone: Sij = Q'i Kj^T and Pij = exp(Sij - lse_i)
        for every query tile that sees key tile j (``key_tile`` minus its gradient matmuls).
        Returns the sum of P, so that the compiler keeps the work."""
        Nq, Nk = q.shape[2], k.shape[2]
        c1 = min(c0 + Bc, Nk)
        n_c = c1 - c0
        S_flat = np.empty(Br * n_c, q.dtype)
        G_flat = np.ones(Br * n_c, q.dtype)
        exponent_bits = np.empty(n_c, np.int32)
        total = 0.0
        Kj = load_tile(k, b, kh, c0, c1)
        for tr in range(tiles_col.shape[0]):
            kind = tiles_col[tr]
            if kind == rules.EMPTY:
                continue
            r0 = tr * Br
            r1 = min(r0 + Br, Nq)
            n_r = r1 - r0
            P = S_flat[:n_r * n_c].reshape((n_r, n_c))
            np.dot(load_tile(q, b, h, r0, r1), Kj.T, P)
            scores_to_p(P, G_flat[:n_r * n_c].reshape((n_r, n_c)), lse, b, h, r0, c0, kind, cap, alibi, slope,
                        offset, Nk, left, right, fast_exp, exponent_bits)
            total += P.sum()
        return total

    @numba.njit(cache=True, parallel=True)
    def recompute_pass(q, k, lse, items, tiles, kv_head, Br, Bc, cap, alibi, slopes, offset, left,
                       right, fast_exp, totals):
        """``key_pass``'s items, recomputing P only (the benchmark's measure of the recompute's share)."""
        for n in numba.prange(items.shape[0]):
            b, h, t = items[n, 0], items[n, 1], items[n, 2]
            totals[n] = recompute_only_tile(q, k, lse, b, h, kv_head[h], t * Bc, tiles[:, t], Br, Bc,
                                            q.dtype.type(cap), alibi, slopes[b, h], offset, left, right,
                                            fast_exp)


def work_items(batch, heads, tiles_per_item):
    """(batch, head, tile) items as an (n, 3) int64 array, heaviest first within each (batch, head):
    ``tiles_per_item[t]`` is how many tiles item t computes (longest-processing-time order, handed
    out one at a time).  Heads stay in order, so that both cores read one head's Q and dO at a time
    from the shared cache: sorting across heads as well measured slower (causal, d = 128: 1.5 s
    against 1.1 s)."""
    order = np.argsort(-np.asarray(tiles_per_item), kind="stable")
    return np.array([(b, h, t) for b in range(batch) for h in range(heads) for t in order],
                    dtype=np.int64).reshape(-1, 3)


_BLAS = [None]


def _blas():
    """SciPy's OpenBLAS handle (looked up once), whose own threads are switched off during a call."""
    if _BLAS[0] is None:
        _BLAS[0] = scipy_openblas() or False
    return _BLAS[0] or None


def _prepare(q, k, v, opts, mask):
    """(launch, Q' = scale Q, k, v) with tiles no larger than the problem."""
    Br, Bc = host.tile_sizes(opts, *default_tiles(mask))
    opts = dataclasses.replace(opts, block_q=max(1, min(Br, q.shape[2])), block_k=max(1, min(Bc, k.shape[2])))
    launch, qc, kc, vc = host.prepare(q, k, v, opts, mask, opts.block_q, opts.block_k)
    qc = qc * qc.dtype.type(launch.softmax_scale)
    return launch, qc, kc, vc


def _launch(kernel, *args):
    """Run a prange kernel with items handed out one at a time and BLAS on one thread inside it."""
    blas = _blas()
    blas_threads = blas.scipy_openblas_get_num_threads() if blas is not None else None
    if blas is not None:
        blas.scipy_openblas_set_num_threads(1)
    chunk = numba.set_parallel_chunksize(1)
    try:
        return kernel(*args)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu's backward failed to compile for {args[0].dtype} inputs: {error}") \
            from error
    finally:
        numba.set_parallel_chunksize(chunk)
        if blas is not None:
            blas.scipy_openblas_set_num_threads(blas_threads)


def recompute_only(q, k, v, out, lse, dout, opts, mask):
    """Run only the recompute of P (``recompute_pass``) for validated inputs; returns the sum of P
    (the number of query rows that see a key, up to rounding: each row of P sums to 1)."""
    launch, qc, kc, _ = _prepare(q, k, v, opts, mask)
    acc = launch.acc_dtype
    lse = np.ascontiguousarray(rebased_lse(lse, opts, mask), dtype=acc)
    items = work_items(q.shape[0], q.shape[1], (launch.tiles != rules.EMPTY).sum(axis=0))
    totals = np.zeros(len(items))
    _launch(recompute_pass, qc, kc, lse, items, launch.tiles, launch.kv_head, launch.Br, launch.Bc,
            launch.softcap, launch.alibi, launch.slopes, launch.offset, launch.left, launch.right,
            acc == np.float32, totals)
    return float(totals.sum())


def run_kernels(launch, q, k, v, out, lse, dout, dq_mode="partials"):
    """(dq, dk per query head, dv per query head) in the accumulation dtype, from prepared q (= Q'), k, v
    and the lse of the rebased scores (``core.reference.rebased_lse``: ALiBi's kernels see no other)."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq must be one of {DQ_MODES}, got {dq_mode!r}")
    acc = launch.acc_dtype
    dout, out = (np.ascontiguousarray(x, dtype=acc) for x in (dout, out))
    lse = np.ascontiguousarray(lse, dtype=acc)
    Dsum = np.empty(out.shape[:3], dtype=acc)
    row_delta(dout, out, Dsum)                                         # pass 1: D = rowsum(dO * O)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    dk = np.empty((B, H, Nk, D), dtype=acc)
    dv = np.empty((B, H, Nk, Dv), dtype=acc)
    partials = dq_mode == "partials"
    dq_parts = np.zeros((numba.config.NUMBA_NUM_THREADS if partials else 1, B, H, Nq, D), dtype=acc)
    seen = launch.tiles != rules.EMPTY
    common = (launch.tiles, launch.kv_head, launch.Br, launch.Bc, launch.softcap, launch.alibi, launch.slopes,
              launch.offset, launch.left, launch.right, launch.round_bits, launch.round_min_exponent,
              acc == np.float32)
    _launch(key_pass, q, k, v, dout, lse, Dsum, work_items(B, H, seen.sum(axis=0)), *common, partials,
            dq_parts, dk, dv)
    dq = np.empty((B, H, Nq, D), dtype=acc)
    scale = acc.type(launch.softmax_scale)                            # dQ = scale dS K
    if partials:
        merge_dq(dq_parts, scale, dq)                                 # the threads' copies summed, scaled
    else:
        _launch(query_pass, q, k, v, dout, lse, Dsum, work_items(B, H, seen.sum(axis=1)), *common, dq)
        dq *= scale
    return dq, dk, dv


def attention_backward(q, k, v, out, lse, dout, opts, mask, dq="partials"):
    """The compiled backward for validated dense inputs: (dq, dk, dv) in q's dtype."""
    launch, qc, kc, vc = _prepare(q, k, v, opts, mask)
    dq_, dk, dv = run_kernels(launch, qc, kc, vc, out, rebased_lse(lse, opts, mask), dout, dq)
    Hk = k.shape[1]
    if Hk != q.shape[1]:
        dk, dv = sum_groups(dk, Hk), sum_groups(dv, Hk)
    return tuple(g.astype(q.dtype, copy=False) for g in (dq_, dk, dv))
