"""This machine, measured with numpy: the figures its roofline is drawn from.

``measure_this_machine()`` measures copy bandwidth, matmul FLOP/s and exp
throughput in about a second or two and returns a ``Measurement``, which
``Measurement.as_hardware()`` turns into a ``Hardware`` whose figures are all
of kind "measured".  ``best_time`` is the timer behind it: repeat until the
fastest runs agree, so a busy neighbour's noise is not kept as a figure.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

import numpy as np

from ..core.hardware import GIGA, MEASURED, Figure, Hardware, KiB, MiB
from ..core.machine import cpu_model
from ..core.rules import dtype_name


@dataclass(frozen=True)
class Measurement:
    """This machine, measured with numpy: the figures behind its roofline.

    bandwidth: bytes/s of ``np.copyto`` on arrays far larger than the caches
    (read + write counted); flops: dtype name -> FLOP/s of ``np.matmul`` on
    square matrices; exp_per_s: float32 ``np.exp`` results per second.  All
    best-of-repeats, so they are what this machine reaches, not an average.
    """

    bandwidth: float
    flops: dict
    exp_per_s: float
    cpu: str
    threads: int
    date: str
    sram_per_core: int | None = None  # L2 bytes per core, from /sys, when the OS says
    runs: dict | None = None  # figure -> how many timed runs it took for the fastest to agree

    def figure(self, what: str, value: float, unit: str) -> Figure:
        return Figure(value, unit, f"measured with numpy by measure_this_machine() on {self.cpu}: {what}",
                      MEASURED, self.date)

    def as_hardware(self) -> Hardware:
        """This machine as a ``Hardware`` (every figure of kind "measured")."""
        measured = {"bandwidth": self.figure("np.copyto", self.bandwidth, "B/s")}
        measured.update({f"flops:{k}": self.figure(f"np.matmul {k}", v, "FLOP/s") for k, v in self.flops.items()})
        sram = self.sram_per_core or 1 * MiB
        return Hardware(
            key="this_machine", name=f"this machine ({self.cpu})", family="cpu",
            peak_flops={k: measured[f"flops:{k}"] for k in self.flops},
            bandwidth=measured["bandwidth"],
            sram_per_unit=Figure(sram, "B", "L2 per core as /sys reports it" if self.sram_per_core
                                 else "unknown: 1 MiB assumed", MEASURED, self.date),
            units=Figure(self.threads, "cores", "os.sched_getaffinity", MEASURED, self.date), unit_name="core",
            exp_per_s=self.figure("np.exp float32", self.exp_per_s, "exp/s"),
            measured=measured, note="measured by measure_this_machine()")

    def ridge(self, dtype="float32") -> float:
        return self.flops[dtype_name(dtype)] / self.bandwidth

    def summary(self) -> str:
        flops = ", ".join(f"{k} matmul {v / GIGA:.1f} GFLOP/s" for k, v in self.flops.items())
        text = (f"{self.cpu}, {self.threads} core(s): copy {self.bandwidth / GIGA:.1f} GB/s, {flops}, "
                f"exp {self.exp_per_s / GIGA:.2f} G/s")
        if self.runs:
            unsettled = max(self.runs.values()) >= MAX_RUNS
            text += ("\n  timed runs: " + ", ".join(f"{what} {n}" for what, n in self.runs.items())
                     + (f"; some never settled within {MAX_RUNS} runs (the machine is busy): measure again"
                        if unsettled else f"; each repeated until its 3 fastest agreed within {STABLE_WITHIN:.0%}"))
        return text


STABLE_WITHIN = 0.05  # the three fastest runs agree this closely before a figure is kept
MAX_RUNS = 40


def best_time(fn, repeats: int = 3, *, max_runs: int = MAX_RUNS) -> tuple:
    """(best seconds, runs): repeat until the ``repeats`` fastest runs agree within 5%, or ``max_runs``.

    The one timer behind ``measure_this_machine`` and chapter 02's timing of
    naive attention, so both say how many runs they took and neither keeps
    a figure before it settles.

    On a busy machine one run can be ten times slower than the next (two shared
    cores read 12.9 GFLOP/s once and 200 the run after), so a fixed best-of-3
    can report the noise; the fastest runs agreeing is the sign that the
    figure is the machine's, not its neighbours'.
    """
    fn()  # warm up: page in the buffers, load the BLAS
    times = []
    while len(times) < max(repeats, 1) or (len(times) < max_runs and _spread(times, repeats) > STABLE_WITHIN):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return max(min(times), 1e-9), len(times)


def settled(runs: int, repeats: int = 3, max_runs: int = MAX_RUNS) -> str:
    """How a ``best_time`` figure came about, in words: the runs it took, and whether they agreed."""
    if runs >= max_runs:
        return f"{runs} runs, never settled within {max_runs} (the machine is busy): measure again"
    return f"{runs} runs, until the {repeats} fastest agreed within {STABLE_WITHIN:.0%}"


def _spread(times, k) -> float:
    fastest = sorted(times)[:max(k, 1)]
    return (fastest[-1] - fastest[0]) / max(fastest[0], 1e-12)


def _l2_per_core() -> int | None:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{index}/size") as f:
                size = f.read().strip()
            if level == "2" and size.endswith("K"):
                return int(size[:-1]) * KiB
    except (OSError, ValueError):
        pass
    return None


def measure_this_machine(*, copy_mib: int = 64, matmul_n: int = 512, exp_n: int = 1 << 22,
                         repeats: int = 3) -> Measurement:
    """Measure copy bandwidth, matmul FLOP/s and exp throughput with numpy (about 1-3 s).

    The figures are what numpy reaches here, with the threads the BLAS uses:
    a lower bound on the machine's peak, and the roofline this course's numpy
    kernels actually live under.
    """
    rng = np.random.default_rng(0)
    runs = {}
    src = np.ones(copy_mib * MiB // 8)
    dst = np.empty_like(src)
    seconds, runs["copy"] = best_time(lambda: np.copyto(dst, src), repeats)
    bandwidth = 2 * src.nbytes / seconds
    flops = {}
    for dtype in (np.float32, np.float64):
        a = rng.standard_normal((matmul_n, matmul_n)).astype(dtype)
        b = rng.standard_normal((matmul_n, matmul_n)).astype(dtype)
        out = np.empty_like(a)
        name = np.dtype(dtype).name
        seconds, runs[f"matmul {name}"] = best_time(lambda: np.matmul(a, b, out=out), repeats)
        flops[name] = 2 * matmul_n ** 3 / seconds
    x = rng.standard_normal(exp_n).astype(np.float32)
    y = np.empty_like(x)
    seconds, runs["exp"] = best_time(lambda: np.exp(x, out=y), repeats)
    exp_per_s = exp_n / seconds
    try:
        threads = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        threads = os.cpu_count() or 1
    return Measurement(bandwidth=bandwidth, flops=flops, exp_per_s=exp_per_s, cpu=cpu_model(),
                       threads=threads, date=datetime.date.today().isoformat(), sram_per_core=_l2_per_core(),
                       runs=runs)
