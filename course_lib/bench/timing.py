"""Timing: how every speed figure in the course is taken.

``time_it`` is the median of several runs after a warm-up, so that compilation,
caches and one unlucky run do not count; ``time_interleaved`` times the two
sides of a ratio in turn, so a load that comes and goes hits both alike;
``cuda_time_it`` times between CUDA events, the kernel layer with no host
overhead in it.
"""
from __future__ import annotations

import statistics
import time


def time_it(fn, *args, repeats=5, warmup=1, **kwargs) -> float:
    """Median wall-clock seconds of ``fn(*args, **kwargs)`` over ``repeats`` runs after ``warmup`` runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_interleaved(calls: dict, *, repeats=5, warmup=1) -> dict:
    """Median seconds of each zero-argument callable in ``calls`` ({name: fn}), timed in turn.

    One run of each per round, so that a load that comes and goes on a shared
    machine hits every contestant alike: use it for the two sides of a ratio.
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(time_it(fn, repeats=1, warmup=0))
    return {name: statistics.median(ts) for name, ts in times.items()}


def cuda_time_it(fn, repeats, warmup=2):
    """(median seconds, every time in ms) of fn() between CUDA events, after warm-up: the kernel
    layer.  The events time the GPU's stream from the first to the second, so when the host takes
    longer to launch fn's kernels than the GPU takes to run them (small problems), the launch time
    is in it too.  Needs torch with CUDA."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times) / 1e3, times
