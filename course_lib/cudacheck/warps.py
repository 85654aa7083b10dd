"""Warp operations: shuffles (``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``, ``shfl_xor_sync``),
votes (``all_sync``, ``any_sync``, ``ballot_sync``), ``syncwarp`` and ``activemask`` among the 32
lanes of a warp.

A thread that reaches one waits (``Scheduler.warp_op``) until every thread of the block has
stopped; then each waiting lane gets its answer from the lanes waiting beside it.  Every lane
its mask names must be one of them, at the same operation: a named lane that finished, waits
at a ``syncthreads``, waits at another operation or is not in the block at all is a
``barrier`` finding (on the GPU the warp hangs or reads garbage), and the operation then
takes the lane's own value in the missing one's place, so the kernel runs on.  A shuffle that
reads a lane its mask does not name reads an undefined value: an ``uninitialized`` finding.

``syncwarp(mask)`` is a barrier of the lanes its mask names, with the same rule, and it orders
their memory: what a lane wrote before it, the others may read after it (``hazards`` compares
the warp's count of syncwarps at the two accesses).  ``activemask()`` gives the lanes of the
warp that reached that same call in the same round: the lanes of a branch, not those that
took the other side or already finished.
"""
from __future__ import annotations

from .sites import where

WARP = 32
SHUFFLES = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync")


def resolve_warps(at_warp, scheduler):
    """Give every thread waiting at a warp operation its result (``thread.result``)."""
    by_tid = {t.tid: t for t in at_warp}
    results, synced = {}, {}
    for t in at_warp:
        name, mask, value, how = t.warp
        base, lane = t.tid - t.tid % WARP, t.tid % WARP
        if name == "activemask":   # the lanes of its warp that reached this same call together
            results[t.tid] = sum(1 << (n - base) for n in range(base, base + WARP)
                                 if n in by_tid and by_tid[n].warp[0] == name and by_tid[n].site == t.site)
            continue
        named = [base + x for x in range(WARP) if mask >> x & 1]
        present = [n for n in named if n in by_tid and by_tid[n].warp[0] == name]
        if len(present) < len(named) or t.tid not in named:
            _report_missing(t, named, present, by_tid, scheduler)
        if name == "syncwarp":
            synced.setdefault(base, []).append(t)
            results[t.tid] = None
        elif name in SHUFFLES:
            src = _source_lane(name, lane, how)
            if src != lane and not mask >> src & 1:
                _report_outside_mask(t, base + src, scheduler)
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
    for base, lanes in synced.items():   # what the lanes wrote before it, they see after it
        phase = scheduler.warp_phase[base] = scheduler.warp_phase.get(base, 0) + 1
        for t in lanes:
            t.wphase = phase


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


def _report_outside_mask(t, src, scheduler):
    grid, name, mask = scheduler.grid, t.warp[0], t.warp[1]
    scheduler.findings.add(
        "uninitialized", ("warp source", t.site), t,
        f"{grid.who(t)} reads the value of "
        f"{grid.threads([src])} through cuda.{name} on {where(t.site)}, but its mask {mask:#010x} does not name "
        "that lane: what a shuffle reads from a lane outside its mask is undefined. A mask from "
        "cuda.activemask() names only the lanes that reached it together (inside `if i < n`, not the tail); "
        "shuffle from every lane with the full mask, giving the lanes past the tail a neutral value (0 for a sum).",
        line=t.site[1])
