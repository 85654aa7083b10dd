"""One block's threads, run one at a time in a fixed order, and the barrier errors that shows.

Each CUDA thread is a Python thread, but only one runs at a time: thread 0 runs until it
reaches a barrier (or the end), then thread 1, and so on; when every thread of the block
waits, the next barrier interval begins.  So the order of a run never depends on luck.
"""
from __future__ import annotations

import threading

from .grid import unravel
from .sites import site, where
from .warps import resolve_warps


def _locked():
    """A lock that starts taken: acquire() waits until another thread releases it (a 0/1 semaphore)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class _Abort(BaseException):
    """Unwinds a simulated thread when the launch stops early."""


class SimThread:
    """One simulated CUDA thread: a Python thread that runs only when the scheduler hands it the turn."""

    def __init__(self, scheduler, tid, blockIdx, body):
        grid = scheduler.grid
        self.scheduler, self.tid, self.blockIdx, self.body = scheduler, tid, blockIdx, body
        self.threadIdx = unravel(tid, grid.blockdim)
        self.gtid = scheduler.block_linear * grid.nthreads + tid   # unique in the launch
        self.turn = _locked()             # released: this thread's turn to run
        self.state = "ready"          # ready | barrier | warp | done | error | aborted
        self.site = None              # the barrier (or warp operation) it waits at
        self.warp = None              # at a warp operation: (name, mask, value, how)
        self.predicate = None
        self.result = None
        self.error = None
        self.declarations = {}        # (code, line) -> how often this thread ran the shared array declared there
        self.wphase = 0               # the cuda.syncwarp() its warp passed last (warps.resolve_warps counts them)
        self.fence = -1               # the access log's clock at this thread's last cuda.threadfence()
        self.acquired = {}            # thread -> clock up to which its writes are visible here (fence + atomic)
        self.os_thread = threading.Thread(target=self.main, daemon=True,
                                          name=f"cudacheck block {blockIdx} thread {self.threadIdx}")

    def main(self):
        scheduler = self.scheduler
        self.turn.acquire()
        try:
            if scheduler.aborting:
                raise _Abort
            self.body()
            self.state = "done"
        except _Abort:
            self.state = "aborted"
        except BaseException as e:  # noqa: BLE001 -- the learner's code raised: the scheduler reports it
            self.state, self.error = "error", e
        finally:
            scheduler.yielded.release()


class Scheduler:
    """Hands the turn to one thread of the block at a time; ``thread`` is the one running now."""

    def __init__(self, grid, findings):
        self.grid, self.findings = grid, findings
        self.thread = None
        self.block_linear = 0
        self.intervals = 0            # barrier intervals run, summed over blocks
        self.aborting = False
        self.yielded = _locked()      # released: the running thread has stopped

    def run_block(self, linear, body, end_interval):
        """Run ``body()`` in every thread of block number ``linear``, calling ``end_interval()``
        each time all of them have reached a barrier or the end.  Returns the thread whose
        ``body`` raised (the block stops there), or None."""
        self.block_linear = linear
        self.warp_phase = {}          # first lane of a warp -> the syncwarps it has passed
        blockIdx = unravel(linear, self.grid.griddim)
        threads = [SimThread(self, tid, blockIdx, body) for tid in range(self.grid.nthreads)]
        for t in threads:
            t.os_thread.start()
        running = threads
        try:
            while running:
                for t in running:       # each in turn, up to its next barrier, warp operation or its end
                    self.thread = t
                    t.turn.release()
                    self.yielded.acquire()
                    if t.state == "error":
                        return t
                at_warp = [t for t in threads if t.state == "warp"]
                if at_warp:             # shuffles and votes exchange their values; their lanes run on
                    resolve_warps(at_warp, self)
                    running = at_warp
                    continue
                waiting = [t for t in threads if t.state == "barrier"]
                finished = [t for t in threads if t.state == "done"]
                self.intervals += 1
                end_interval()
                if waiting:
                    self._check_barrier(waiting, finished)
                    predicates = [t.predicate for t in waiting]
                    for t in waiting:
                        t.result = predicates
                    _share_acquired(waiting)
                running = waiting
        finally:
            if any(t.state in ("ready", "barrier", "warp") for t in threads):
                self.aborting = True
                for t in threads:
                    if t.state in ("ready", "barrier", "warp"):
                        t.turn.release()
                        self.yielded.acquire()
            for t in threads:
                t.os_thread.join()
        return None

    def barrier(self, frame, predicate):
        """The running thread waits at the barrier ``frame`` is at; the predicates of all, once all wait."""
        t = self.thread
        t.site, t.predicate, t.state = site(frame), predicate, "barrier"
        self.yielded.release()
        t.turn.acquire()
        if self.aborting:
            raise _Abort
        t.state = "ready"
        return t.result

    def warp_op(self, frame, name, mask, value, how=None):
        """The running thread reaches warp operation ``name``: it waits until its warp's lanes have
        reached theirs, then gets what the operation gives it (``warps.resolve_warps``)."""
        t = self.thread
        t.site, t.warp, t.state = site(frame), (name, int(mask) & 0xFFFFFFFF, value, how), "warp"
        self.yielded.release()
        t.turn.acquire()
        if self.aborting:
            raise _Abort
        t.state, t.warp = "ready", None
        return t.result

    def _check_barrier(self, waiting, finished):
        sites = {}
        for t in waiting:
            sites.setdefault(t.site, []).append(t.tid)
        block = self.grid.block_name(self.block_linear)
        threads = self.grid.threads
        if len(sites) > 1:
            (s1, t1), (s2, t2) = list(sites.items())[:2]
            self.findings.add("barrier", ("divergent", s1, s2), waiting[0],
                              f"in block {block}, {threads(t1)} wait at cuda.syncthreads() on {where(s1)} "
                              f"while {threads(t2)} wait at the one on {where(s2)}: "
                              "every thread of a block must reach the same syncthreads. Move it out of the "
                              "branch that only some threads take.", line=s1[1])
        if finished:
            site, tids = next(iter(sites.items()))
            done = sorted(t.tid for t in finished)
            self.findings.add("barrier", ("not reached", site), waiting[0],
                              f"in block {block}, {threads(done)} finished the kernel without reaching the "
                              f"cuda.syncthreads() on {where(site)} that {threads(tids)} wait at: a barrier "
                              "must be reached by every thread of the block, as often as by the others. Don't "
                              "return before a barrier (guard the loads and stores with `if i < n:` instead), "
                              "and give a loop that holds one the same trip count in every thread (mask inside "
                              "it instead).", line=site[1])


def _share_acquired(threads):
    """What one thread of the block has acquired (other blocks' fenced writes) the barrier shows to all."""
    known = {}
    for t in threads:
        for g, clock in t.acquired.items():
            if g not in known or known[g] < clock:
                known[g] = clock
    if known:
        for t in threads:
            t.acquired = dict(known)
