"""Timing: how every speed figure in the course is taken.

``time_it`` is the median of several runs after a warm-up, so that compilation,
caches and one unlucky run do not count; ``time_interleaved`` times the two
sides of a ratio in turn, so a load that comes and goes hits both alike;
``cuda_time_it`` times between CUDA events, the kernel layer with no host
overhead in it.  ``spread`` summarises alternated rounds (min, median, max:
on a shared machine the noise is part of the figure), ``verdict``
is a check's one-line result (a speed is quoted only for an answer that passed
one), and ``log`` is a run's progress line.
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


def interleaved_rounds(calls: dict, rounds: int, *, warmup=1) -> dict:
    """{name: [seconds per round]} of each zero-argument callable in ``calls`` ({name: fn}), timed in turn.

    One run of each per round, after ``warmup`` warm-up rounds, so that a load
    that comes and goes on a shared machine hits every contestant alike.
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def time_interleaved(calls: dict, *, repeats=5, warmup=1) -> dict:
    """Median seconds of each zero-argument callable in ``calls`` ({name: fn}), timed in turn
    (``interleaved_rounds``): use it for the two sides of a ratio."""
    return {name: statistics.median(ts) for name, ts in interleaved_rounds(calls, repeats, warmup=warmup).items()}


def spread(values, unit=None, *, every=False) -> dict:
    """min, median and max of ``values`` (the rounds of one measurement), as floats.

    The keys are ``min``, ``median``, ``max``, each followed by ``_<unit>`` when a
    unit is given (``spread(ts, "s")`` gives ``min_s``, ``median_s``, ``max_s``),
    so each record kind keeps the key names it has always had.  ``every=True``
    adds ``rounds`` (how many) and ``times_<unit>`` (every value, in order).
    """
    values = [float(x) for x in values]
    if not values:
        raise ValueError("spread needs at least one value")
    suffix = f"_{unit}" if unit else ""
    out = {f"min{suffix}": min(values), f"median{suffix}": float(statistics.median(values)),
           f"max{suffix}": max(values)}
    if every:
        out.update({"rounds": len(values), f"times{suffix}": values})
    return out


def verdict(fn) -> str:
    """Run the check ``fn()``; its one-line verdict: "PASS", "FAIL ..." (an AssertionError, as
    ``course_lib.checks`` raises) or "ERROR <type>: ..." (anything else)."""
    try:
        fn()
        return "PASS"
    except AssertionError as error:
        msg = (str(error).splitlines() or ["(no message)"])[0][:300]
        return msg if msg.startswith("FAIL") else "FAIL " + msg
    except Exception as error:  # noqa: BLE001 -- a crashing candidate is a verdict, not the end of the run
        return f"ERROR {type(error).__name__}: {str(error)[:300]}"


_START = time.time()


def log(*parts) -> None:
    """A progress line of a run, stamped with the seconds since the harness was loaded and flushed at
    once (a long GPU run is followed as it goes, and a crash leaves its last line)."""
    print(f"[{time.time() - _START:7.1f} s]", *parts, flush=True)


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
