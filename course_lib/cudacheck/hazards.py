"""The log of who touched each element in which barrier interval, and the races, out-of-bounds
indices and uninitialized reads it shows.

A race is found from this log, not from a bad interleaving happening to show up: two
accesses to one element, at least one a write, by two threads with no barrier between
them (same block, same interval) or by threads of two blocks (nothing orders blocks).
"""
from __future__ import annotations

import numpy as np

from .memory import TracedArray, index_str, outside
from .sites import site, where


class AccessLog:
    """Every access of a launch's threads goes through here; ``scheduler.thread`` is the one making it."""

    def __init__(self, grid, findings, scheduler):
        self.grid, self.findings, self.scheduler = grid, findings, scheduler
        self.nthreads = grid.nthreads
        self.epoch = 0            # the barrier interval; unique across blocks, since blocks run in turn
        self.pending_uninit = []  # reads of never-written elements, judged when the interval ends
        self.clock = 0            # counts writes and fences: orders them for threadfence
        # intervals in which a thread read global memory, then shared: loads issued ahead of the arithmetic
        self.prefetch_intervals = 0
        self._loaded, self._ahead = set(), False

    def new_interval(self):
        self.epoch += 1

    def end_interval(self):
        """Report this interval's reads of elements nothing wrote before, and start the next interval."""
        for mem, key, t, at, array, index in self.pending_uninit:
            # written later in this interval by another thread: that is a race, reported as one
            if mem.private or key not in mem.writes or mem.writes[key][0] == t.gtid:
                self._report("uninitialized", (mem.name, at[1]), t,
                             f"{self.grid.who(t)} reads {array.name}[{index_str(index)}] at {where(at)}, "
                             f"but nothing wrote {mem.title()} there earlier in this launch"
                             f"{self._uninit_hint(mem, key)}", mem, index, at)
        self.pending_uninit = []
        self.prefetch_intervals += self._ahead
        self._loaded, self._ahead = set(), False
        self.new_interval()

    def _conflicts(self, t, other, other_epoch, other_phase):
        """An access by thread ``t`` now and one by thread ``other`` in ``other_epoch`` (at its warp's
        ``other_phase``) are unordered: another block, or this interval with no cuda.syncwarp() between."""
        g, n = t.gtid, self.nthreads
        if other == g:
            return False
        if other // n != g // n:
            return True
        if other_epoch != self.epoch:
            return False
        return other_phase is None or t.wphase <= other_phase or (other % n) // 32 != (g % n) // 32

    # Who touched an element, kept small: the last write, and for reads the first thread that read it in
    # the latest interval that read it, the second (or the latest after a cuda.syncwarp()), plus one reader
    # from an older block.  That is enough to
    # find a race on every racy element: blocks run in turn and intervals in order, so a write races
    # with an earlier read exactly when the reader is another thread of this interval or of an older
    # block, and if any such reader exists, one of the kept ones is such a reader.

    def read(self, mem, key, array, index, frame):
        mem.n_reads += 1
        if mem.private:   # a thread's own local array: only whether it was ever written matters
            if key not in mem.writes:
                self.pending_uninit.append((mem, key, self.scheduler.thread, site(frame), array, index))
            return mem.flat[key] if mem.int_range is None else int(mem.flat[key])
        at = site(frame)
        t = self.scheduler.thread
        w = mem.writes.get(key)
        g = t.gtid
        if mem.space == "global":
            self._loaded.add(g)
        elif g in self._loaded:
            self._ahead = True
        if w is not None and self._conflicts(t, w[0], w[1], w[5]) and not self._published(t, w):
            self._race(mem, array, index, t, "reads", at, w[0], "wrote", w[2])
        slot = mem.reads.get(key)
        if slot is None:
            mem.reads[key] = [self.epoch, g, at, None, None, None, None, t.wphase, None]
        elif slot[0] != self.epoch:
            if slot[1] // self.nthreads != g // self.nthreads:   # keep one reader of an older block
                slot[5], slot[6] = slot[1], slot[2]
            slot[:5] = [self.epoch, g, at, None, None]
            slot[7], slot[8] = t.wphase, None
        elif slot[1] != g and (slot[3] is None or t.wphase > slot[8]):   # the second: the latest warp phase's
            slot[3], slot[4], slot[8] = g, at, t.wphase
        if not mem.initialized and key not in mem.writes:
            self.pending_uninit.append((mem, key, t, at, array, index))
        return mem.flat[key] if mem.int_range is None else int(mem.flat[key])

    def write(self, mem, key, array, index, frame, value, atomic=False):
        mem.n_writes += 1
        if mem.int_range is not None and isinstance(value, (int, np.integer)) and \
                not mem.int_range[0] <= value <= mem.int_range[1]:
            value = self._overflow(mem, array, index, frame, int(value))
        if mem.private:
            mem.writes[key] = True   # only whether it was written: nobody else can touch it
            mem.flat[key] = value
            return
        at = site(frame)
        t = self.scheduler.thread
        g = t.gtid
        w = mem.writes.get(key)
        if w is not None and self._conflicts(t, w[0], w[1], w[5]) and not (atomic and w[3]) and \
                not self._published(t, w):
            self._race(mem, array, index, t, "writes", at, w[0], "wrote", w[2])
        slot = mem.reads.get(key)
        if slot is not None:
            for reader, rsite, repoch, rphase in ((slot[1], slot[2], slot[0], slot[7]),
                                                  (slot[3], slot[4], slot[0], slot[8]), (slot[5], slot[6], -1, None)):
                if reader is not None and self._conflicts(t, reader, repoch, rphase):
                    self._race(mem, array, index, t, "writes", at, reader, "read", rsite)
                    break
        mem.writes[key] = (g, self.epoch, at, atomic, self.clock, t.wphase)
        self.clock += 1
        mem.flat[key] = value

    def atomic(self, ary, idx, frame, update, name):
        """``cuda.atomic.<name>(ary, idx, ...)``: the element becomes ``update(old)``; returns old."""
        if not isinstance(ary, TracedArray):
            raise TypeError(f"cuda.atomic.{name}: the first argument must be an array, got {type(ary).__name__}")
        key = ary._locate(idx, "updates", frame)
        if type(key) is not int:
            if key is None:
                return outside(ary.dtype)
            raise TypeError(f"cuda.atomic.{name}: index {idx!r} names a sub-array of {ary.name}, not an element")
        mem = ary._mem
        self._synchronize(mem, key)
        mem.n_reads += 1
        old = mem.flat[key] if mem.int_range is None else int(mem.flat[key])
        if not mem.initialized and key not in mem.writes:   # garbage, whoever updates the element next
            t, at = self.scheduler.thread, site(frame)
            self._report("uninitialized", (mem.name, at[1]), t,
                         f"{self.grid.who(t)} updates {ary.name}[{index_str(idx)}] with cuda.atomic.{name} at "
                         f"{where(at)}, but nothing wrote {mem.title()} there earlier in this launch, so the "
                         f"update starts from garbage{self._uninit_hint(mem, key)}", mem, idx, at)
        self.write(mem, key, ary, idx, frame, update(old), atomic=True)
        return old

    def _overflow(self, mem, array, index, frame, value):
        """``value`` does not fit the integer element it is stored in: the GPU keeps its low bits."""
        at, t = site(frame), self.scheduler.thread
        lo, hi = mem.int_range
        bits = 8 * mem.data.dtype.itemsize
        kept = value & ((1 << bits) - 1)
        if lo < 0 and kept > hi:
            kept -= 1 << bits
        self._report("integer_overflow", (mem.name, at[1]), t,
                     f"{mem.title()} ({mem.data.dtype}): {self.grid.who(t)} stores {value} into "
                     f"{array.name}[{index_str(index)}] at {where(at)}, but a {mem.data.dtype} holds {lo} to {hi}: "
                     f"the GPU keeps the low {bits} bits, {kept}, without a word. Accumulate in a wider type "
                     "(int32 for sums of int8 products) and clamp a value to the range before storing it into "
                     "a narrow one.", mem, index, at)
        return kept

    # Fences: the CUDA guide's last-block pattern is a write, cuda.threadfence(), then an atomic; a thread
    # whose atomic on the same element comes later sees the write (and so, after a barrier, its block does).

    def fence(self):
        self.scheduler.thread.fence = self.clock
        self.clock += 1

    def _synchronize(self, mem, key):
        """The running thread's atomic on ``key``: it acquires what earlier atomics there released."""
        t = self.scheduler.thread
        released = mem.releases.setdefault(key, {})
        for g, clock in released.items():
            if g not in t.acquired or t.acquired[g] < clock:
                t.acquired[g] = clock
        released[t.gtid] = max(released.get(t.gtid, -1), t.fence)   # -1: synchronized, but nothing fenced

    def _published(self, t, w):
        """The write ``w`` was fenced before an atomic that thread ``t`` has since acquired."""
        return t.acquired.get(w[0], -1) > w[4]

    def _race(self, mem, array, index, t, verb, at, other, other_verb, other_site):
        where_other = "" if other // self.nthreads == t.gtid // self.nthreads else " (another block)"
        if other // self.nthreads != t.gtid // self.nthreads and other in t.acquired:
            fix = ("This thread synchronized with that one through an atomic (its atomic came after that "
                   "thread's), but that thread wrote the element with no cuda.threadfence() between the write "
                   "and its atomic, so the write may not be visible yet: put cuda.threadfence() after the "
                   "write, before the atomic.")
            when = "in the same launch"
        elif other // self.nthreads != t.gtid // self.nthreads:
            fix = ("Nothing orders two blocks: give each element to one block, or use cuda.atomic "
                   "for a sum that several blocks add to.")
            when = "in the same launch"
        elif verb == "reads":
            fix = ("Put cuda.syncthreads() between the write and the read; in a loop over tiles, also one at "
                   "the end of the loop body, so that the next load waits for the last read.")
            when = "in the same barrier interval"
        elif other_verb == "read":
            fix = ("Add a cuda.syncthreads() after the last read, before the element is overwritten "
                   "(in a loop over tiles: at the end of the loop body).")
            when = "in the same barrier interval, so the write can land before the read"
        else:
            fix = "Let one thread write each element, or separate the writes with cuda.syncthreads()."
            when = "in the same barrier interval"
        if len(mem.names) > 1:
            fix += (f" {' and '.join(f'`{n}`' for n in mem.names)} are one device array in this launch: "
                    "pass a separate output (a copy), or let every thread read before any thread writes.")
        if mem.redeclared:
            fix += (f" `{mem.name}` is one array for the whole block, however often its declaration runs: "
                    "every call of the function that declares it, every trip of the loop, uses the same "
                    "shared memory, so a barrier must end each use before the next begins.")
        other_thread = self.grid.who_else(other, self.scheduler.block_linear)
        self._report("race", (mem.name, at[1], other_site[1]), t,
                     f"{mem.title()}: {self.grid.who(t)} {verb} {array.name}[{index_str(index)}] at "
                     f"{where(at)}, which {other_thread}{where_other} {other_verb} at "
                     f"{where(other_site)} {when}. {fix}", mem, index, at)

    def out_of_bounds(self, array, index, axis, access, frame):
        """``index`` is outside ``array`` on ``axis``; ``access``: 'reads', 'writes' or 'updates'."""
        at = site(frame)
        t, mem = self.scheduler.thread, array._mem
        i, n = index[axis], array.shape[axis]
        shape = f"shape {tuple(array.shape)}"
        if i < 0 and i >= -n:
            what = (f"index {i} on axis {axis} is negative: numba wraps it to {i + n}, the other end of the "
                    "axis, without a word, which a kernel almost never means. Guard the edge "
                    "(e.g. `if i > 0:`) before reaching for a neighbour.")
        else:
            what = (f"index {i} is outside axis {axis} of length {n}: on a GPU this {access[:-1]} lands on "
                    "another element or outside the allocation, with no error. Guard it, e.g. "
                    f"`if i < {array.name}.shape[{axis}]:`.")
        self._report("out_of_bounds", (mem.name, at[1], i < 0), t,
                     f"{mem.title()} ({shape}): {self.grid.who(t)} {access} {array.name}[{index_str(index)}] at "
                     f"{where(at)}: {what}", mem, index, at)

    def _report(self, kind, key, t, message, mem, index, at):
        self.findings.add(kind, key, t, message, mem.title(), index, at[1])

    def _uninit_hint(self, mem, key):
        """Why the element may be unwritten, and what to do."""
        n = self.nthreads
        if mem.space == "shared" and key >= n and mem.data.size > n and max(mem.writes, default=0) < n:
            # one element per thread was loaded, and the array is larger than the block
            blockdim = self.grid.blockdim[:self.grid.blocknd]
            return (f": `{mem.name}` has {mem.data.size} elements, but the block has {n} threads (blockdim "
                    f"{blockdim[0] if len(blockdim) == 1 else blockdim}) and only elements below {n} were "
                    f"written, one per thread. A size fixed in the kernel must match the launch: launch "
                    f"{mem.data.size} threads a block, or let each thread load several elements "
                    f"(`for e in range(t, {mem.data.size}, cuda.blockDim.x)`).")
        if mem.space == "shared":
            return (": shared memory starts as garbage in every block. Write every element a thread will "
                    "read before the barrier, e.g. a neutral value (0, or -inf for a running max) past a tail.")
        if mem.space == "local":
            return ": a local array starts as garbage. Set it (e.g. to 0) before accumulating into it."
        return (": it came from cuda.device_array, which is not zeroed. Write it before reading it, or "
                "pass an initialized array.")
