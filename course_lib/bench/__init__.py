"""Timing and regression records: how every speed figure in the course is made.

A benchmark is a script, never a test.  It times a call with ``time_it`` (the
median of several runs after a warm-up, so that compilation, caches and one
unlucky run do not count), and appends one JSON line per measurement with
``append_record``: the problem (shape, dtype, mask, block sizes), the time, the
FLOP/s and bytes derived from it, and where it ran (``environment()``).  The
chapters read the records back with ``load_records`` and plot them.

    from course_lib import bench
    t = bench.time_it(course_lib.attention, q, k, v, impl="flash_numpy", causal=True)
    bench.append_record("notebooks/records/mine.jsonl", benchmark="mine", impl="flash_numpy",
                        shape=(B, H, Nq, Nk, D), dtype="float32", causal=True, time_s=t)

A speed-up is only quoted as a ratio of two records of the same ``run``: two
timings taken minutes apart on a shared machine are not comparable.
"""
from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..core import machine
from . import envreport
from ..models.iomodel import attention_flops  # the one FLOP convention speeds are quoted in: visible pairs


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


def torch_naive(q, k, v, causal):
    """The ``torch_naive`` peer: S = QK^T scaled, causal aligned bottom right, softmax, then P @ V."""
    import torch
    with torch.no_grad():
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            n, m = s.shape[-2:]
            s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1 + m - n), -torch.inf)
        return torch.softmax(s, -1) @ v


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


def environment() -> dict:
    """Where a measurement was taken: CPU, GPU (or none), versions, date and time."""
    facts = {
        "cpu": machine.cpu_model(),
        "cpu_cores": machine.cpu_cores(),
        "python": platform.python_version(),
        **{name: envreport.package_version(name) for name in ("numpy", "numba", "numba-cuda", "course_lib")},
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    gpu = machine.gpu()  # {"kind": "cuda" | "simulator" | "none", "name": ..., "driver_cuda": ...}
    facts["gpu"] = gpu["name"] if gpu["kind"] == "cuda" else gpu["kind"]
    if "driver_cuda" in gpu:
        facts["gpu_driver"] = gpu["driver_cuda"]
    return facts


def new_run() -> str:
    """An id for one run of a benchmark; records sharing it were measured together."""
    return datetime.datetime.now().astimezone().strftime("%Y%m%dT%H%M%S%z")


def attention_bytes(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, head_dim_v=None, *, itemsize) -> int:
    """The compulsory traffic: read Q, K, V once, write O once (and lse, float32)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    elements = (batch * heads * seqlen_q * (head_dim + head_dim_v)
                + batch * heads_k * seqlen_k * (head_dim + head_dim_v))
    return int(elements * itemsize + batch * heads * seqlen_q * 4)


def record(*, benchmark, impl, shape, dtype, time_s, causal=False, causal_align="bottom_right",
           window_size=(-1, -1), mask=None, block_q=None, block_k=None, heads_k=None, head_dim_v=None,
           bytes_moved=None, run=None, env=None, layer="end to end", device=None, **extra) -> dict:
    """One regression record, as a JSON-ready dict.

    ``shape`` is (B, H, Nq, Nk, D); ``heads_k`` / ``head_dim_v`` default to H / D.
    FLOPs count the (query, key) pairs the mask lets through (``causal``,
    ``causal_align``, ``window_size``): ``iomodel.attention_flops``.
    ``mask`` describes the mask in words ("causal", "window (8, 0)", ...;
    default "causal" or "none").  ``bytes_moved`` is what the kernel moved
    (its own count, when it keeps one); without it the compulsory traffic of
    ``attention_bytes`` is stored, and ``bytes_source`` says which.  Extra
    keyword fields (tile counts, repeats, ...) are stored as given.
    """
    B, H, Nq, Nk, D = (int(n) for n in shape)
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0, got {time_s}")
    heads_k = H if heads_k is None else int(heads_k)
    head_dim_v = D if head_dim_v is None else int(head_dim_v)
    dtype = np.dtype(dtype)
    flops = attention_flops(B, H, Nq, Nk, D, causal=causal, causal_align=causal_align,
                            window_size=tuple(window_size), head_dim_v=head_dim_v)
    if bytes_moved is None:
        bytes_moved, source = attention_bytes(B, H, heads_k, Nq, Nk, D, head_dim_v, itemsize=dtype.itemsize), "compulsory"
    else:
        source = extra.pop("bytes_source", "counted")
    env = environment() if env is None else env
    run = run or new_run()
    return {
        "benchmark": benchmark, "run": run, "run_id": run, "impl": impl,
        "device": device or env.get("cpu"), "layer": layer,
        "B": B, "H": H, "Nq": Nq, "Nk": Nk, "D": D, "median_ms": float(time_s) * 1e3,
        "shape": [B, H, Nq, Nk, D], "heads_k": heads_k, "head_dim_v": head_dim_v,
        "dtype": dtype.name, "mask": mask or ("causal" if causal else "none"), "causal": bool(causal),
        "block_q": block_q, "block_k": block_k,
        "time_s": float(time_s), "flops": flops, "tflops": flops / time_s / 1e12,
        "bytes_moved": int(bytes_moved), "bytes_source": source,
        **extra,
        "environment": env,
    }


def append_record(path, **fields) -> dict:
    """Build ``record(**fields)`` and append it to the JSON-lines file ``path``; returns it."""
    rec = record(**fields)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
    return rec


def load_records(path, **match) -> list:
    """Every record in ``path`` (oldest first) whose fields equal ``match`` (e.g. impl="flash_numpy")."""
    with Path(path).open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if all(r.get(key) == value for key, value in match.items())]


def latest_run(records) -> list:
    """The records of the most recent run among ``records`` (runs are compared, never mixed)."""
    if not records:
        return []
    last = records[-1]["run"]
    return [r for r in records if r["run"] == last]

