"""Steps ``mma_f16``, ``mma_tf32`` and ``mma_3xtf32`` on the host: which kernel runs, its plan and launch.

The kernels (``versions``) tile both matmuls on the tensor cores, FlashAttention-2's way.

Every step before this one computes S = Q K^T and O += P V with one FMA per
multiply-add, about 67 TFLOP/s on an H200 however well it is fed.  A tensor
core does a whole 16 x 8 x 16 product per warp-wide instruction (``mma.sync``,
``mma``), an order of magnitude faster, if the
operands are halves (float16 / bfloat16) or tf32.  The kernel is FA2's:

- a block is ``warps`` warps; each warp owns 16 query rows, and its Q
  fragments stay in registers for the whole kernel (no shared memory for Q);
- each K / V tile of ``Bc`` keys is loaded by the whole block into shared
  memory (rows padded by 4 words: a warp's fragment loads hit 32 different
  banks);
- S (16 x Bc per warp) is ``Bc / 8`` accumulator fragments; the rules (scale,
  softcap, ALiBi, the mask on PARTIAL and tail tiles) are applied to them where
  they are, element (row, column) being ``mma.c_elem(lane, reg)``;
- the row max and sum: a row's 16 x 8 fragments live on the 4 lanes of a quad,
  so two ``shfl_xor`` (1, 2) finish each reduction: no shared memory, no barrier;
- P goes from S's accumulators straight into P V's A fragments (two floats
  packed into one word of halves: ``mma``'s register reuse), so P never leaves
  the registers either;
- O (16 x Dv per warp) is ``Dv / 8`` accumulator fragments, in float32.

``mma_f16`` takes float16 or bfloat16 inputs (one m16n8k16 per 16 x 8 x 16)
and rounds P to the input dtype before P V, as ``core.rules`` says every
low-precision kernel does.  For P V's B fragments the V tile is stored
transposed (a word holds two keys of one output dim: ``mma.low_halves``).

``mma_3xtf32`` takes float32 and keeps float32 accuracy on the tf32 tensor
cores as PyTorch's efficient kernel does: every operand is split into a tf32
high part and its remainder, x = hi + lo, and a b = hi_a hi_b + hi_a lo_b +
lo_a hi_b (three m16n8k8, the lo lo term below float32's rounding).  P's
accumulators are not in A's layout for m16n8k8; the keys of each 8-key chunk
are taken in the order (0, 2, 4, 6, 1, 3, 5, 7) by A and by B alike, which
puts them there (a sum does not care in which order its terms come).

The layout (tilings, where P's accumulators go, the swizzle and the rows each
lane gives ldmatrix) is plain Python in ``layout``; ``make_mma_kernel`` builds
the version a tiling asks for (``version_of``).  Tiles skipped, split-KV and
the launch are chapter 10's ``cuda_steps.run``'s (the same visit lists, the
same (out, lse) partials and merge).  Inline PTX runs on a GPU only; in
numba's simulator every version runs with its instructions emulated
(``instructions.ops`` is ``sim`` there), on small problems; not in cudacheck.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

try:
    import numba
    from numba import cuda
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from ...core import rules
from ...core.masks import MaskSpec
from ...core.options import call_forward
from ...core.reference import lse_of_rebased, nan_lse_where_out_is_nan
from .. import launch as host
from ..cuda_steps.device import SIMULATOR, on_gpu
from ..cuda_steps.run import Plan, kernel_args
from ..cuda_steps.run import launcher as run_launcher
from ..cuda_steps.tiling import MAX_SHARED, STATIC_SHARED
from ..cuda_steps.tuning import decode_splits as _decode_splits
from ..flash_numba_cuda import sim_max_work
from .layout import (
    DECODE_ROWS,
    KINDS,
    MmaTiling,
    decode_tiling,
    default_tiling,
    kernel_shape,
    kind_of,
    shared_bytes,
    words,
)

if numba is not None:
    from . import versions


def available() -> bool:
    """Inline PTX needs a real GPU (sm_80 or newer for these mma shapes); numba's simulator runs the same
    kernels with the instructions emulated (``sim``)."""
    return numba is not None and (SIMULATOR or on_gpu())


def version_of(tiling: MmaTiling):
    """The name of the kernel version (``versions``) that runs ``tiling``: cp.async's two stages, else
    ldmatrix's swizzled tiles, else the padded tiles loaded a word at a time, register-staged, or staged and
    prefetched.  Only the register-staged padded tiles are prefetched (``prefetch`` is step b's)."""
    if tiling.q_shared:
        return "q_shared"
    if tiling.stages == 2:
        return "cp_async"
    if tiling.ldmatrix:
        return "ldmatrix"
    if not tiling.staged:
        return "plain"
    return "prefetch" if tiling.prefetch else "staged"


_KERNELS = {}


def make_mma_kernel(kind: str, tiling: MmaTiling, D: int, Dv: int):
    """The tensor-core forward for ``kind`` ("f16", "bf16", "tf32x1" or "tf32x3") with ``tiling`` at head dims
    D, Dv: its version's kernel (``version_of``), built once per shape."""
    key = (kind, tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    limit = MAX_SHARED if tiling.stages > 1 else STATIC_SHARED     # cp.async's buffers: dynamic shared memory
    if shared_bytes(kind, tiling, D, Dv) > limit or tiling.Bc % 16:
        raise ValueError(f"{tiling} at D={D}, Dv={Dv} takes {shared_bytes(kind, tiling, D, Dv)} bytes of shared "
                         f"memory (at most {limit}) or Bc is not a multiple of 16")
    if tiling.ldmatrix and tiling.stages == 1 and not tiling.staged:
        raise ValueError(f"ldmatrix's swizzled tiles are filled by staged loads or by cp.async (stages=2), got {tiling}")
    if tiling.stages not in (1, 2) or (tiling.stages == 2 and not tiling.ldmatrix):
        raise ValueError(f"stages is 1 or 2, and 2 (cp.async) copies rows as they are: it needs ldmatrix=True "
                         f"(V by keys, swizzled), got {tiling}")
    if tiling.split_once and (kind != "tf32x3" or not tiling.ldmatrix):
        raise ValueError(f"split_once is 3xTF32's step on swizzled tiles (ldmatrix=True), got {kind} with {tiling}")
    if tiling.q_shared and (tiling.stages != 2 or (kind == "tf32x3") != tiling.split_once):
        raise ValueError(f"q_shared is step (f), on top of cp.async (stages=2), and for 3xTF32 of split_once: got "
                         f"{kind} with {tiling}")
    make = {"plain": versions.make_plain_kernel, "staged": versions.make_staged_kernel,
            "prefetch": versions.make_prefetch_kernel, "ldmatrix": versions.make_ldmatrix_kernel,
            "cp_async": versions.make_cp_async_kernel,
            "q_shared": versions.make_q_shared_kernel}[version_of(tiling)]
    _KERNELS[key] = make(kernel_shape(kind, tiling, D, Dv))
    return _KERNELS[key]


def plan(step, q, k, v, opts, mask, *, tiling=None, splits=1) -> Plan:
    """One launch of ``step``, decided on the host: ``run``'s Plan (the kernel, the grid (B*H, Tr, S), the
    arguments of every micro-tiled step), so that ``run.launcher`` launches it and merges split-KV's pieces."""
    kind = kind_of(step, q.dtype)
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    tiling = tiling or (decode_tiling(kind, D, Dv) if Nq <= DECODE_ROWS else default_tiling(kind, D, Dv))
    if opts.block_q not in (None, tiling.Br) or opts.block_k not in (None, tiling.Bc):
        raise ValueError(f"{step} runs {tiling.Br} x {tiling.Bc} tiles (warps of 16 rows); pass tiling=MmaTiling(...) "
                         f"to change them, not block_q / block_k")
    kernel = make_mma_kernel(kind, tiling, D, Dv)
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, tiling.Br, tiling.Bc)[0]
    args, splits = kernel_args(launch, splits)
    grid = (B * H, launch.tiles.shape[0], splits)
    dynamic = shared_bytes(kind, tiling, D, Dv) if tiling.stages > 1 else 0
    return Plan(step, kernel, grid, tiling.threads, dynamic, args, splits, (B, H, Nq, Dv), launch, tiling)


def decode_splits(step, dtype, B, H, Nq, Nk, D, Dv, tiling=None, *, group=1):
    """Split-KV's rule (``tuning.decode_splits``) for a tensor-core launch: (splits, the numbers it used), for
    the launch's tiling (``decode_tiling`` at decode's few rows); registers taken at their limit, 255.
    ``group``: query heads packed into a block's rows (``packed_group``): H / group blocks of Nq group rows."""
    kind = kind_of(step, dtype)
    H, Nq = H // group, Nq * group
    tiling = tiling or (decode_tiling(kind, D, Dv) if Nq <= DECODE_ROWS else default_tiling(kind, D, Dv))
    return _decode_splits(B * H * -(-Nq // tiling.Br), -(-Nk // tiling.Bc), tiling, D, Dv, regs=255,
                          shared=shared_bytes(kind, tiling, D, Dv))


def packed_group(q, k, opts, mask):
    """How many query heads decode packs into the rows of one block: G = H / Hk when one query row (Nq = 1)
    of a GQA / MQA call sees every key, else 1.

    The G query heads of a K / V head then share one launch row tile: the block reads its K / V tile once
    for G rows of the mma instead of G blocks reading it once each for one row (15 of an mma's 16 rows
    idle).  FlashAttention-2 does the same (``seqlenq_ngroups_swapped`` in ``mha_fwd``: q reshaped from
    (b, 1, Hk G, d) to (b, G, Hk, d)) under the same conditions: no ALiBi (its bias differs per head, so per
    packed row) and no window left of the key range or short of its end (the rows, now G query positions,
    would see different keys).  Causal decode aligned bottom right sees every key, so it packs."""
    B, H, Nq, _ = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    if Nq != 1 or H == Hk or opts.alibi_slopes is not None or not isinstance(mask, MaskSpec):
        return 1
    left, right = mask.window
    sees_all = (left < 0 or mask.offset - left <= 0) and (right < 0 or mask.offset + right >= Nk - 1)
    return H // Hk if sees_all else 1


def pack_decode(q, k, opts, mask):
    """(G, q, mask) of the launch: ``packed_group``'s G, and where G > 1 q as (B, Hk, G, D) (head h = kh G + g is
    row g of K / V head kh: a reshape, no copy) with the mask of G rows that see every key."""
    group = packed_group(q, k, opts, mask)
    if group == 1:
        return 1, q, mask
    B, H, _, D = q.shape
    return group, q.reshape(B, H // group, group, D), MaskSpec(group, k.shape[2])


def launcher(step, q, k, v, opts, mask, *, tiling=None, splits=1, pack=True):
    """(a zero-argument callable that runs one launch on device arrays, out, lse): the inputs converted and
    copied to the device once, here, so that a timing loop times the kernel (and split-KV's merge) alone.
    Decode's query heads are packed (``packed_group``; ``pack=False``: each its own block, for a benchmark to
    compare): the launch is one of (B, Hk, G) rows without a mask, and out / lse are views of its rows as (B, H, 1).
    With ALiBi lse is that of the rebased scores (``mma_forward`` takes the rebasing back)."""
    B, H, Nq, D = q.shape
    group, q, mask = pack_decode(q, k, opts, mask) if pack else (1, q, mask)
    p = plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    kind = kind_of(step, q.dtype)
    qw, kw, vw = (cuda.to_device(words(x, kind)) for x in (q, k, v))
    p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    out = cuda.to_device(np.full(p.out_shape, np.nan, np.float32))
    lse = cuda.to_device(np.full(p.out_shape[:3], np.nan, np.float32))
    parts = (None, None) if p.splits == 1 else (
        cuda.to_device(np.full((p.splits, *p.out_shape), np.nan, np.float32)),
        cuda.to_device(np.full((p.splits, *p.out_shape[:3]), np.nan, np.float32)))
    go = run_launcher(p, qw, kw, vw, out, lse, *parts)
    if group > 1:
        out, lse = out.reshape(B, H, Nq, p.out_shape[3]), lse.reshape(B, H, Nq)
    return go, out, lse


def mma_forward(q, k, v, opts, mask, step="mma_f16", *, tiling=None, splits=1):
    """Run ``step`` on validated dense numpy inputs: (out in the input dtype, lse) (an ``attention_forward``)."""
    if not available():
        raise RuntimeError(f"{step} is inline PTX for a GPU's tensor cores: it runs on a GPU, or in numba's "
                           "simulator (NUMBA_ENABLE_CUDASIM=1) with its instructions emulated")
    B, H, Nq, D = q.shape
    if not on_gpu() and B * H * Nq * k.shape[2] * (D + v.shape[3]) > sim_max_work():
        raise ValueError(f"the simulator takes only small problems (B*H*Nq*Nk*(D+Dv) <= {sim_max_work()})")
    go, out, lse = launcher(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    go()
    out, lse = out.copy_to_host(), lse.copy_to_host()
    lse = lse_of_rebased(lse, opts, mask)   # the kernel (and split-KV's merge) summed ALiBi's rebased scores
    lse = nan_lse_where_out_is_nan(out, lse).astype(rules.lse_dtype(q.dtype), copy=False)
    return out.astype(rules.out_dtype(q.dtype)), lse


def attention(q, k, v, *, step="mma_f16", tiling=None, splits=1, return_lse=False, **options):
    """``course_lib.attention`` for a tensor-core step with its tiling and split-KV pieces chosen by hand."""
    from functools import partial
    return call_forward(partial(mma_forward, step=step, tiling=tiling, splits=splits), q, k, v,
                        return_lse=return_lse, **options)
