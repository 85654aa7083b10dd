"""Chapter 08: the tiled FlashAttention forward compiled with Numba, one measured version at a time.

The algorithm is chapter 05's FA2 loop order, unchanged: for each query tile
Qi, for each key / value tile (Kj, Vj), compute Sij = scale * Qi Kj^T, fold it
into the running (m, l, Oi) with the online softmax, and at the end write
Oi / l and lse once.  What changes is who runs it: ``numba.njit`` compiles the
loops to machine code, so a loop costs what its arithmetic costs, not what the
interpreter charges per numpy call.  Like llm.c's ``attention_forward.cu``, the
versions live side by side (``versions.py``), each a diff on the one before,
each an impl (``flash_numba_cpu_<version>``; the last is ``flash_numba_cpu``)
so that chapter 08 and ``benchmarks/cpu_attention.py`` time them side by side:

============  =========================================================================  ====  =======
version       what it changes                                                             ms   GFLOP/s
============  =========================================================================  ====  =======
microkernel   both tile matmuls by the 4 x 2 micro-kernel ``matmul_nt`` on padded        149     58
              tiles; every score through the scalar rules; query tiles in zigzag
              order over ``prange``'s static split; 64 x 64 tiles
blas          the matmuls by ``np.dot`` on contiguous tiles (SciPy's BLAS), Kj and Vj     116     74
              read where they lie, Qi scaled once as it is read
rowvec        a row's scores scaled, capped, biased and masked by whole-row loops, no      82    104
              branch per score (``softmax_tile_vector``)
balanced      host only: the items by cost, heaviest and lightest in turn, so that         87     99
              every thread's contiguous run holds the same work
tuned         host only: tiles from this CPU's L2 (``tile_sizes_for``); the keys split     62    139
              across items where there are too few items for the cores (decoding)
exp2          base 2: log2(e) folded into Qi, the row max vectorised, 2**(s - m) and      52    165
              its sum in one loop (``softmax_tile_exp2``)
wide          host only: PyTorch's CPU tiles (``wide_tiles``: 256 x 512 from Nq = 768)     57    151
scratch       tile buffers allocated once per thread, not once per work item: a freed     48    179
              512 KiB tile handed back to the OS comes back as page faults
handout       (= ``flash_numba_cpu``) the items heaviest first, each thread taking the     49    174
              next from a shared counter (``fetch_add``), so that a thread that loses
              its core for a while takes fewer items instead of holding the others up
============  =========================================================================  ====  =======

Medians over alternated rounds at (B, H, N, D) = (1, 8, 2048, 64), float32, not
causal, two threads of a shared AMD EPYC, run 20261202T150442+0000
(notebooks/records/cpu_attention.jsonl, ``cpu_steps``), where PyTorch's own
CPU kernel (SDPA flash) took 51 ms.  Modules: ``tile`` (what an item does to
one tile besides BLAS: the micro-kernel, the vectorised exp, the row passes),
``host`` (tile sizes, work items, BLAS threads, the launch), ``versions``.

Precision follows ``rules``: inputs converted to float32 (float64 for float64
input), S, m, l and Oi in that dtype, P rounded to float16 / bfloat16 before
P V for those inputs, output rounded to the input dtype at the end.
Float8 inputs are dequantised on the host (``launch.prepare``) and P is
rounded to e4m3 by the same ``round_to_bits``; their output is float32.
``fastmath`` is switched on in part: reassociation, contraction (fused
multiply-add), reciprocals; not ``nnan`` / ``ninf``, which would let the
compiler assume no value is ever -inf or NaN (masked scores are -inf, and a
NaN input must come out NaN).

Processes: numba's threading layer here (OpenMP) does not survive ``fork``:
a child forked after the parent ran this kernel must not call it (it can
hang or abort).  Start worker processes with ``spawn`` (``multiprocessing.
get_context("spawn")``, or a fresh interpreter via ``subprocess``), as the
course's benchmarks and grader do.

Compiled code is cached on disk (``cache=True``): the first call in a fresh
checkout compiles for a while (chapter 08 measures how long), later processes
load the machine code.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ...core import rules
from ...core.reference import lse_of_rebased, nan_lse_where_out_is_nan
from .. import launch as host_launch
from . import versions
from .host import (
    MIN_ITEMS_PER_THREAD,
    balanced_items,
    blas_core,
    heaviest_first_items,
    key_splits,
    scipy_openblas,
    thread_runs,
    tile_sizes_for,
    wide_tiles,
    zigzag_items,
)
from .tile import FASTMATH

if numba is not None:
    from .tile import (
        exp2_and_sum,
        exp_row,
        matmul_nt,
        maximum,
        softmax_tile_exp2,
        softmax_tile_scalar,
        softmax_tile_vector,
    )
    from .versions import fetch_add, handout_kernel, scratch_kernel, tile_buffers

__all__ = ["FASTMATH", "FINAL_VERSION", "MIN_ITEMS_PER_THREAD", "VERSIONS", "Version", "attention_forward",
           "available", "balanced_items", "blas_core", "course_tiles", "exp2_and_sum", "exp_row", "fetch_add",
           "flash_forward", "handout_kernel", "heaviest_first_items", "key_splits", "l2_tiles", "matmul_nt",
           "maximum", "pytorch_tiles", "run_kernel", "scipy_openblas", "scratch_kernel", "softmax_tile_exp2",
           "softmax_tile_scalar", "softmax_tile_vector", "thread_runs", "tile_buffers", "tile_sizes_for",
           "wide_tiles", "zigzag_items"]


def course_tiles(q, v):
    """The course's 64 x 64 tile."""
    return host_launch.DEFAULT_TILES["flash_numba_cpu"]


def l2_tiles(q, v):
    """The largest tile that fills at most half of this CPU's L2 (``tile_sizes_for``)."""
    return tile_sizes_for(q.shape[3], v.shape[3], rules.acc_dtype(q.dtype).itemsize)


def pytorch_tiles(q, v):
    """PyTorch's CPU tiles for this Nq (``wide_tiles``)."""
    return wide_tiles(q.shape[2])


@dataclass(frozen=True)
class Version:
    """One version of the kernel: what it changes, its tiles when a call gives none, and its launch."""

    what: str
    tiles: Callable      # (q, v) -> (Br, Bc)
    run: Callable        # (launch, q, k, v, splits) -> (out, lse) in the accumulation dtype


VERSIONS = {
    "microkernel": Version("4 x 2 register micro-kernel, scalar rules per score, zigzag items, 64 x 64",
                           course_tiles, versions.run_microkernel),
    "blas": Version("tile matmuls by np.dot on contiguous tiles (SciPy's BLAS), Qi scaled once",
                    course_tiles, versions.run_blas),
    "rowvec": Version("scores scaled, capped and masked by whole-row loops: no branch per score",
                      course_tiles, versions.run_rowvec),
    "balanced": Version("work items by cost, heaviest and lightest in turn: even runs",
                        course_tiles, versions.run_balanced),
    "tuned": Version("tile sizes from the L2 size, keys split across cores when items are few",
                     l2_tiles, versions.run_tuned),
    "exp2": Version("log2(e) folded into Qi: row max vectorised, exp2 and its sum in one loop",
                    l2_tiles, versions.run_exp2),
    "wide": Version("PyTorch's tiles, 256 x 512: half as many BLAS calls, each longer",
                    pytorch_tiles, versions.run_exp2),
    "scratch": Version("tile buffers allocated once per thread, not once per work item",
                       pytorch_tiles, versions.run_scratch),
    "handout": Version("work items heaviest first, handed out one at a time from a shared counter",
                       pytorch_tiles, versions.run_handout),
}
FINAL_VERSION = "handout"    # impl flash_numba_cpu; every other version v is impl flash_numba_cpu_v


def available() -> bool:
    return numba is not None


def run_kernel(launch, q, k, v, step=FINAL_VERSION, splits=None):
    """Run version ``step`` on prepared (contiguous, acc-dtype) q, k, v: (out, lse) in acc dtype."""
    return VERSIONS[step].run(launch, q, k, v, splits)


def flash_forward(q, k, v, opts, mask, step=FINAL_VERSION, splits=None):
    """The compiled forward for validated dense inputs: (out in q's dtype, lse).

    A tile is never larger than the problem: block_k = 10**8 on 100 keys runs
    one tile of 100 keys, and the buffers are sized by that.
    """
    Br, Bc = host_launch.tile_sizes(opts, *VERSIONS[step].tiles(q, v))
    opts = dataclasses.replace(opts, block_q=min(Br, q.shape[2]), block_k=min(Bc, k.shape[2]))
    launch, *arrays = host_launch.prepare(q, k, v, opts, mask, opts.block_q, opts.block_k)
    out, lse = run_kernel(launch, *arrays, step=step, splits=splits)
    lse = lse_of_rebased(lse, opts, mask)   # the kernel summed ALiBi's rebased scores
    # The NaN rule, on the host like every impl: a NaN in V reaches rows that
    # cannot see its key through 0 * NaN, and such a row must not report an lse
    # that looks healthy.
    lse = nan_lse_where_out_is_nan(out, lse)
    return out.astype(rules.out_dtype(q.dtype), copy=False), lse.astype(rules.lse_dtype(q.dtype), copy=False)


attention_forward = flash_forward
