"""Warp operations: shuffles (``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``, ``shfl_xor_sync``)
and votes (``all_sync``, ``any_sync``, ``ballot_sync``) among the 32 lanes of a warp.

A thread that reaches one waits (``Scheduler.warp_op``) until every thread of the block has
stopped; then each waiting lane gets its answer from the lanes waiting beside it.  Every lane
its mask names must be one of them, at the same operation: a named lane that finished, waits
at a ``syncthreads``, waits at another operation or is not in the block at all is a
``barrier`` finding (on the GPU the warp hangs or reads garbage), and the operation then
takes the lane's own value in the missing one's place, so the kernel runs on.
"""
from __future__ import annotations

from .sites import where

WARP = 32
SHUFFLES = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync")


def resolve_warps(at_warp, scheduler):
    """Give every thread waiting at a warp operation its result (``thread.result``)."""
    by_tid = {t.tid: t for t in at_warp}
    results = {}
    for t in at_warp:
        name, mask, value, how = t.warp
        base, lane = t.tid - t.tid % WARP, t.tid % WARP
        named = [base + x for x in range(WARP) if mask >> x & 1]
        present = [n for n in named if n in by_tid and by_tid[n].warp[0] == name]
        if len(present) < len(named) or t.tid not in named:
            _report_missing(t, named, present, by_tid, scheduler)
        if name in SHUFFLES:
            src = _source_lane(name, lane, how)
            other = by_tid.get(base + src)
            results[t.tid] = other.warp[2] if other is not None and base + src in present else value
        else:
            votes = [bool(by_tid[n].warp[2]) for n in present]
            if name == "all_sync":
                results[t.tid] = int(all(votes))
            elif name == "any_sync":
                results[t.tid] = int(any(votes))
            else:   # ballot_sync
                results[t.tid] = sum(1 << (n - base) for n, v in zip(present, votes) if v)
    for t in at_warp:
        t.result = results[t.tid]


def _source_lane(name, lane, how):
    """The lane a shuffle reads from: out of range (up past 0, down past 31), the lane's own."""
    if name == "shfl_sync":
        return int(how) % WARP
    if name == "shfl_xor_sync":
        return (lane ^ int(how)) % WARP
    src = lane - int(how) if name == "shfl_up_sync" else lane + int(how)
    return src if 0 <= src < WARP else lane


def _report_missing(t, named, present, by_tid, scheduler):
    grid, name, mask = scheduler.grid, t.warp[0], t.warp[1]
    missing = [n for n in named if n not in present]
    if t.tid not in named:
        why = f"its mask {mask:#010x} does not name the thread itself"
    else:
        absent = missing[0]
        if absent >= grid.nthreads:
            fate = f"are not in the block (it has {grid.nthreads} threads)"
        elif absent in by_tid:
            fate = f"wait at cuda.{by_tid[absent].warp[0]} on {where(by_tid[absent].site)} instead"
        else:
            fate = "finished the kernel or wait at a cuda.syncthreads() instead"
        shown = [n for n in missing if n < grid.nthreads] or missing
        why = f"its mask {mask:#010x} names {grid.threads(shown)}, which {fate}"
    scheduler.findings.add(
        "barrier", ("warp", t.site), t,
        f"in block {grid.block_name(scheduler.block_linear)}, {grid.threads(sorted(present) or [t.tid])} "
        f"wait at cuda.{name} on {where(t.site)}, but {why}: every lane a _sync mask names must reach the "
        "same call. Call it from every lane the mask names and use the result only where it is needed, or "
        "give it the mask of the lanes that do reach it.", line=t.site[1])
