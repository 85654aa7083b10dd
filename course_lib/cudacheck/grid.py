"""The shape of a launch (grid of blocks, block of threads) and how a finding names its threads."""
from __future__ import annotations

import numpy as np


def dim3(dim, what):
    """A launch's ``griddim`` or ``blockdim`` as a tuple of 1 to 3 positive ints (an int is one axis)."""
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {dim!r}")
    return tuple(int(d) for d in dims)


class Dim3(tuple):
    """(x, y, z), readable as ``.x``, ``.y``, ``.z`` like ``cuda.threadIdx``."""
    x = property(lambda self: self[0])
    y = property(lambda self: self[1])
    z = property(lambda self: self[2])


def padded(dims):
    return Dim3(tuple(dims) + (1,) * (3 - len(dims)))


def unravel(linear, dims):
    """The (x, y, z) position of number ``linear`` in a block (or grid) of shape ``dims``, x fastest."""
    x, y, z = padded(dims)
    return Dim3((linear % x, linear // x % y, linear // (x * y)))


def index_name(idx, ndim):
    """(5, 0, 0) in a 1-D launch reads as 5; in a 2-D one as (5, 0)."""
    return str(idx[0]) if ndim == 1 else str(tuple(idx[:ndim]))


class Grid:
    """A launch's ``griddim`` and ``blockdim``, padded to 3 axes; ``gridnd``, ``blocknd``: the axes it gave."""

    def __init__(self, griddim, blockdim):
        self.gridnd, self.blocknd = len(griddim), len(blockdim)
        self.griddim, self.blockdim = padded(griddim), padded(blockdim)
        self.nthreads = int(np.prod(self.blockdim))
        if self.nthreads > 1024:
            raise ValueError(f"blockdim {blockdim} has {self.nthreads} threads; a CUDA block has at most 1024")
        self.nblocks = int(np.prod(self.griddim))

    def who(self, thread):
        """'thread 5 of block 1'."""
        return (f"thread {index_name(thread.threadIdx, self.blocknd)} of block "
                f"{index_name(thread.blockIdx, self.gridnd)}")

    def who_else(self, gtid, block_linear):
        """Thread number ``gtid`` of the launch, named as seen from block ``block_linear``."""
        threadIdx = unravel(gtid % self.nthreads, self.blockdim)
        if gtid // self.nthreads == block_linear:
            return f"thread {index_name(threadIdx, self.blocknd)}"
        blockIdx = unravel(gtid // self.nthreads, self.griddim)
        return f"thread {index_name(threadIdx, self.blocknd)} of block {index_name(blockIdx, self.gridnd)}"

    def block_name(self, block_linear):
        return index_name(unravel(block_linear, self.griddim), self.gridnd)

    def threads(self, tids):
        """Linear thread numbers of one block, in words: 'threads 0-15, 32-47'."""
        plural = "s" if len(tids) > 1 else ""
        if self.blocknd > 1:
            shown = ", ".join(index_name(unravel(t, self.blockdim), self.blocknd) for t in tids[:3])
            return f"thread{plural} {shown}" + (f" and {len(tids) - 3} more" if len(tids) > 3 else "")
        runs = []
        for t in tids:
            if runs and t == runs[-1][1] + 1:
                runs[-1][1] = t
            else:
                runs.append([t, t])
        return f"thread{plural} " + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
