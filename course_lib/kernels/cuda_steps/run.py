"""The host side of every step: plan a launch, run it, check the inputs it takes.

``plan`` decides one launch of a step on the host: the kernel (from the step's
Tiling, ``factory``: ``tiled``'s, ``tiled_prefetch``'s, one of ``tiled_vec4``'s
steps' or ``tiled_staged``'s, or chapter 09's for ``row`` / ``row_exp2``), the grid, the dynamic
shared memory and the arguments.  Causal (and window) tile skipping is the
host's, as in chapters 08 and 09: ``launch.prepare`` classifies the tiles, and
each query tile gets the list of the key tiles it visits (``visit_lists``), so
a skipped tile costs nothing, not even a branch.  Split-KV (``splits > 1``)
cuts each list into that many pieces, one block each, and ``merge_kernel``
combines their partial (out, lse).

Shared memory is one dynamic buffer, so that a block may use more than the
48 KB a static array is allowed; above 48 KB the driver must be told
(``allow_shared``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

try:
    import numba
    from numba import cuda
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from ...core import rules
from ...core.options import call_forward
from ...core.reference import lse_of_rebased, nan_lse_where_out_is_nan
from .. import flash_numba_cuda as ch09
from .. import launch as host
from .device import on_gpu
from .merge import make_merge_kernel, merge_threads
from .tiled import make_tiled_kernel
from .tiled_prefetch import make_prefetch_kernel
from .tiled_staged import make_staged_kernel
from .tiled_vec4 import VEC_FACTORY
from .tiling import SIM_TILING, STATIC_SHARED, STEP_TILING, TUNED, Tiling

SIMT_STEPS = ("row", "row_exp2", "tiled", "tiled_unsigned", "tiled_padded", "tiled_prefetch", "tiled_rebuilt",
              "tiled_shuffle", "tiled_reorder", "tiled_aligned", "tiled_vec4", "tiled_staged", "tuned")
SPLIT_KV_STEPS = SIMT_STEPS[2:]   # the micro-tiled steps: they take ``splits`` (row / row_exp2 are chapter 09's)


def factory(tiling):
    """The micro-tiled kernel's factory a Tiling runs: by ``vec`` and ``prefetch``, and for the
    vectorised kernels without prefetch by their switches (``tiling.VEC_SWITCHES``)."""
    if not tiling.vec:
        return make_prefetch_kernel if tiling.prefetch else make_tiled_kernel
    return make_staged_kernel if tiling.prefetch else VEC_FACTORY[tiling.switches]


def available() -> bool:
    """The steps run on a GPU or in numba's simulator (NUMBA_ENABLE_CUDASIM=1); not in cudacheck,
    which does not model dynamic shared memory."""
    return numba is not None and (bool(numba.config.ENABLE_CUDASIM) or on_gpu())


@dataclass(frozen=True)
class Plan:
    """One launch of a step, decided on the host."""

    step: str
    kernel: object
    griddim: tuple
    blockdim: int
    shared: int              # dynamic shared memory, bytes
    args: tuple              # everything between (q, k, v) and (out, lse)
    splits: int
    out_shape: tuple         # (B, H, Nq, Dv)
    launch: host.Launch
    tiling: Tiling = None


def tiling_for(step, D):
    """The Tiling a step runs with: its own, ``TUNED[D]`` for ``tuned``, and in the simulator
    the step's switches (pad, prefetch, unsigned, vec, align, shuffle, last_first) on the small SIM_TILING."""
    if not on_gpu():
        own = STEP_TILING.get("tiled_staged" if step == "tuned" else step, Tiling())
        return replace(SIM_TILING, pad=own.pad, prefetch=own.prefetch, unsigned=own.unsigned, vec=own.vec,
                       align=own.align, shuffle=own.shuffle, last_first=own.last_first)
    if step == "tuned":
        return TUNED.get(D, STEP_TILING["tiled_staged"])
    return STEP_TILING[step]


def visit_lists(tiles):
    """(Tr, Tc) tile kinds -> (visit (Tr, Tc) int32: the key tiles each query tile computes, in order;
    nvisit (Tr,) int32: how many).  EMPTY tiles are left out: skipping is decided here."""
    keep = tiles != rules.EMPTY
    visit = np.zeros(tiles.shape, dtype=np.int32)
    nvisit = keep.sum(axis=1).astype(np.int32)
    for tr in range(tiles.shape[0]):
        cols = np.flatnonzero(keep[tr])
        visit[tr, :cols.size] = cols
    return visit, nvisit


def kernel_args(launch, splits):
    """(the arguments a micro-tiled or tensor-core step takes between (q, k, v) and (out, lse), the split-KV
    pieces the longest visit list allows): visit lists, tile kinds, K / V heads, and the scale, softcap and
    ALiBi slopes in log2 units (the kernels work in base 2)."""
    visit, nvisit = visit_lists(launch.tiles)
    unit = rules.LOG2E
    args = (visit, nvisit, launch.tiles, launch.kv_head.astype(np.int32), np.float32(launch.softmax_scale * unit),
            np.float32(launch.softcap * unit), launch.alibi, (launch.slopes * unit).astype(np.float32),
            launch.offset, launch.left, launch.right)
    return args, max(1, min(int(splits), int(nvisit.max()) if nvisit.size else 1))


def plan(step, q, k, v, opts, mask, *, tiling=None, splits=1) -> Plan:
    """The kernel and launch of ``step`` for validated dense float32 inputs."""
    if step not in SIMT_STEPS:
        raise ValueError(f"step must be one of {SIMT_STEPS}, got {step!r}")
    if q.dtype != np.float32:
        raise TypeError(f"chapter 10's kernels compute in float32 only; q, k and v are {q.dtype}")
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    if step in ("row", "row_exp2"):
        p = ch09.plan(q, k, v, opts, mask, exp2=(step == "row_exp2"))
        return Plan(step, p.kernel, p.griddim, p.blockdim, 0, p.args, 1, p.out_shape, p.launch)
    tiling = tiling or tiling_for(step, D)
    Br, Bc = host.tile_sizes(opts, tiling.Br, tiling.Bc)
    tiling = replace(tiling, Br=Br, Bc=Bc)
    kernel = factory(tiling)(tiling, D, Dv)
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, tiling.Br, tiling.Bc)[0]
    args, splits = kernel_args(launch, splits)
    Tr = launch.tiles.shape[0]
    grid = (B * H, Tr, splits) if tiling.vec and tiling.last_first else (Tr, B * H, splits)
    return Plan(step, kernel, grid, tiling.threads,
                tiling.shared_bytes(D, Dv), args, splits, (B, H, Nq, Dv), launch, tiling)


def allow_shared(kernel, args, nbytes):
    """Compile ``kernel`` for ``args`` and tell the driver its blocks may use ``nbytes`` of dynamic
    shared memory: above 48 KB a launch fails unless the kernel has opted in."""
    if nbytes <= STATIC_SHARED or not on_gpu():
        return
    from numba.cuda.cudadrv.driver import binding, driver
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    cufunc = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)


def launcher(p: Plan, q, k, v, out, lse, part_out=None, part_lse=None):
    """A zero-argument callable that runs the plan on device arrays (or, in the simulator, numpy ones).

    ``out`` (B, H, Nq, Dv) and ``lse`` (B, H, Nq), the lse of ALiBi's rebased scores (``forward`` takes the
    rebasing back); with splits > 1 also the partials ``part_out`` (S, B, H, Nq, Dv) and ``part_lse`` (S, B, H, Nq)."""
    if p.step in ("row", "row_exp2"):
        run = p.kernel[p.griddim, p.blockdim]
        return lambda: run(q, k, v, *p.args, out, lse)
    if p.splits == 1:
        shape = (1, *p.out_shape)
        dest = (out.reshape(shape), lse.reshape(shape[:4]))
    else:
        dest = (part_out, part_lse)
    args = (q, k, v, *p.args, *dest)
    allow_shared(p.kernel, args, p.shared)
    run = p.kernel[p.griddim, p.blockdim, 0, p.shared]
    if p.splits == 1:
        return lambda: run(*args)
    threads = merge_threads(int(np.prod(p.out_shape)))     # PIECES threads an output element
    fold = make_merge_kernel()[-(-threads // 128), 128]

    def go_split():
        run(*args)
        fold(part_out, part_lse, out, lse)
    return go_split


def forward(q, k, v, opts, mask, step="tuned", *, tiling=None, splits=1):
    """Run ``step`` on validated dense numpy inputs: (out, lse), float32 (an ``attention_forward``)."""
    p = plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    if not on_gpu():
        if not numba.config.ENABLE_CUDASIM:
            raise RuntimeError("chapter 10's kernels run on a GPU or in numba's simulator "
                               "(set NUMBA_ENABLE_CUDASIM=1 before numba is imported)")
        if B * H * Nq * Nk * (D + Dv) > ch09.SIM_MAX_WORK:
            raise ValueError(f"the simulator takes only small problems: B*H*Nq*Nk*(D+Dv) = "
                             f"{B * H * Nq * Nk * (D + Dv)} is above {ch09.SIM_MAX_WORK}")
    qa, ka, va = (np.ascontiguousarray(x) for x in (q, k, v))
    # poisoned, so that an element nothing wrote shows up as a NaN in the check
    out = np.full(p.out_shape, np.nan, dtype=np.float32)
    lse = np.full(p.out_shape[:3], np.nan, dtype=np.float32)
    parts = (np.full((p.splits, *p.out_shape), np.nan, dtype=np.float32),
             np.full((p.splits, *p.out_shape[:3]), np.nan, dtype=np.float32))
    # device arrays on the GPU and in the simulator alike: a launch with host arrays copies every
    # one of them back, and the inputs may be read-only (they are never written)
    arrays = tuple(cuda.to_device(a) for a in (qa, ka, va, out, lse, *parts))
    p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    launcher(p, *arrays)()
    out, lse = arrays[3].copy_to_host(), arrays[4].copy_to_host()
    lse = lse_of_rebased(lse, opts, mask)   # the kernels (and split-KV's merge) summed ALiBi's rebased scores
    return out, nan_lse_where_out_is_nan(out, lse).astype(rules.lse_dtype(q.dtype), copy=False)


def attention(q, k, v, *, step="tuned", tiling=None, splits=1, return_lse=False, **options):
    """``course_lib.attention`` for one of chapter 10's steps, with its Tiling and split-KV pieces
    chosen by hand (same options, same validation)."""
    return call_forward(partial(forward, step=step, tiling=tiling, splits=splits), q, k, v,
                        return_lse=return_lse, **options)


