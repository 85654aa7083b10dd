"""What ``cuda`` is inside a checked kernel: numba.cuda's kernel-side API, each call handed to the launch."""
from __future__ import annotations

import sys

from .gpumath import gpu_version
from .memory import numpy_dtype

# what a checked kernel may call on ``cuda`` beyond indices, arrays, barriers, fences and atomics
WARP_OPS = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "all_sync", "any_sync", "ballot_sync",
            "syncwarp", "activemask")
MODELLED = ("threadIdx", "blockIdx", "blockDim", "gridDim", "laneid", "warpsize", "grid", "gridsize",
            "shared.array", "local.array", "const.array_like", "syncthreads", "syncthreads_count",
            "syncthreads_and", "syncthreads_or", "threadfence", "threadfence_block", "threadfence_system",
            "atomic.add", "atomic.sub", "atomic.max", "atomic.min", "atomic.exch", "atomic.cas") + WARP_OPS

WARP_SIZE = 32


class FakeCuda:
    """``cuda`` for one launch: indices from the thread the scheduler runs, barriers through the
    scheduler, arrays from ``allocate``, atomics through the access log."""
    warpsize = WARP_SIZE

    def __init__(self, grid, scheduler, log, allocate):
        self._grid, self._scheduler, self._log = grid, scheduler, log
        self.shared = _Arrays(allocate, "shared")
        self.local = _Arrays(allocate, "local")
        self.const = _Const()
        self.atomic = _Atomic(log)

    threadIdx = property(lambda self: self._scheduler.thread.threadIdx)
    blockIdx = property(lambda self: self._scheduler.thread.blockIdx)
    blockDim = property(lambda self: self._grid.blockdim)
    gridDim = property(lambda self: self._grid.griddim)
    laneid = property(lambda self: self._scheduler.thread.tid % WARP_SIZE)

    def grid(self, ndim):
        t = self._scheduler.thread
        pos = tuple(b * d + i for b, d, i in zip(t.blockIdx, self._grid.blockdim, t.threadIdx))
        return pos[0] if ndim == 1 else pos[:ndim]

    def gridsize(self, ndim):
        size = tuple(g * b for g, b in zip(self._grid.griddim, self._grid.blockdim))
        return size[0] if ndim == 1 else size[:ndim]

    def syncthreads(self):
        self._scheduler.barrier(sys._getframe(1), None)

    def syncthreads_count(self, predicate):
        return sum(self._scheduler.barrier(sys._getframe(1), bool(predicate)))

    def syncthreads_and(self, predicate):
        return int(all(self._scheduler.barrier(sys._getframe(1), bool(predicate))))

    def syncthreads_or(self, predicate):
        return int(any(self._scheduler.barrier(sys._getframe(1), bool(predicate))))

    def shfl_sync(self, mask, value, src_lane):
        return self._scheduler.warp_op(sys._getframe(1), "shfl_sync", mask, value, src_lane)

    def shfl_up_sync(self, mask, value, delta):
        return self._scheduler.warp_op(sys._getframe(1), "shfl_up_sync", mask, value, delta)

    def shfl_down_sync(self, mask, value, delta):
        return self._scheduler.warp_op(sys._getframe(1), "shfl_down_sync", mask, value, delta)

    def shfl_xor_sync(self, mask, value, lane_mask):
        return self._scheduler.warp_op(sys._getframe(1), "shfl_xor_sync", mask, value, lane_mask)

    def all_sync(self, mask, predicate):
        return self._scheduler.warp_op(sys._getframe(1), "all_sync", mask, bool(predicate))

    def any_sync(self, mask, predicate):
        return self._scheduler.warp_op(sys._getframe(1), "any_sync", mask, bool(predicate))

    def ballot_sync(self, mask, predicate):
        return self._scheduler.warp_op(sys._getframe(1), "ballot_sync", mask, bool(predicate))

    def syncwarp(self, mask=0xFFFFFFFF):
        self._scheduler.warp_op(sys._getframe(1), "syncwarp", mask, None)

    def activemask(self):
        return self._scheduler.warp_op(sys._getframe(1), "activemask", 0, None)

    def threadfence(self):
        self._log.fence()   # this thread's writes so far are seen by any thread that sees its next atomic

    threadfence_system = threadfence

    def threadfence_block(self):
        pass  # orders writes within the block only, which a barrier does anyway: nothing to model

    def __getattr__(self, name):
        real = getattr(sys.modules.get("numba.cuda"), name, None)
        if type(real).__module__.startswith("numba.core.types"):   # cuda.float32 and the like: plain types
            return gpu_version(real) or real
        raise NotImplementedError(
            f"cudacheck does not model cuda.{name}; it models {', '.join(MODELLED)}. Check a version of the "
            "kernel without it.")


class _Arrays:
    """``cuda.shared`` or ``cuda.local``."""

    def __init__(self, allocate, space):
        self._allocate, self._space = allocate, space

    def array(self, shape, dtype, alignment=None):
        return self._allocate(self._space, shape, numpy_dtype(dtype), sys._getframe(1))


class _Const:
    def array_like(self, ary):
        return ary


class _Atomic:
    """``cuda.atomic``: each operation one read and one write of the element, made atomic in the log."""

    def __init__(self, log):
        self._log = log

    def _op(name, combine):  # not a method: builds the methods below
        def op(self, ary, idx, val):
            return self._log.atomic(ary, idx, sys._getframe(1), lambda old: combine(old, val), name)
        op.__name__ = name
        return op

    add = _op("add", lambda old, v: old + v)
    sub = _op("sub", lambda old, v: old - v)
    max = _op("max", lambda old, v: old if old >= v else v)
    min = _op("min", lambda old, v: old if old <= v else v)
    exch = _op("exch", lambda old, v: v)
    del _op

    def cas(self, ary, idx, old, val):
        return self._log.atomic(ary, idx, sys._getframe(1), lambda cur: val if cur == old else cur, "cas")

    def compare_and_swap(self, ary, old, val):
        return self.cas(ary, 0, old, val)
