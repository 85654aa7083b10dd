"""Regression records: one JSON line per measurement, saying what was timed and where.

``record`` builds one: the problem (shape, dtype, mask, block sizes), the
time, the layer it measures (``LAYERS``), the FLOPs and bytes derived from the
problem, and where it ran (``environment()``); ``append_record`` appends it to
a JSON-lines file, and the chapters read the records back with
``load_records`` and compare only records of one run (``latest_run``).
Every record file is written through ``RecordFile`` (or ``write_records``): one
sorted JSON line a record, flushed at once.

A FLOP rate is work over time, and the FLOPs are always the kernel's work
(``core.flops.attention_flops``), so a record carries one only where its time
includes that work: the kernel layer and end to end (the whole call, the
kernel inside it: a lower bound on the kernel's rate).  A launch time is the
host's cost of starting the kernel, without its work, so a launch record
carries no FLOP rate.
"""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import numpy as np

from ..core import machine
from ..core.flops import attention_flops
from . import envreport

LAYERS = ("kernel", "launch", "end to end")  # what a time measures
RATED_LAYERS = ("kernel", "end to end")  # the layers whose time includes the kernel's work


def environment() -> dict:
    """Where a measurement was taken: CPU (its name and, in ``cpu_identity``, its vendor, family / model /
    stepping, microarchitecture, SIMD extensions and flags), GPU (or none), versions, date and time."""
    facts = {
        "cpu": machine.cpu_model(),
        "cpu_cores": machine.cpu_cores(),
        "cpu_identity": machine.cpu_identity(),   # the same name can be another chip: family, model, flags
        "python": platform.python_version(),
        **{name: envreport.package_version(name) for name in ("numpy", "numba", "numba-cuda", "course_lib")},
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    gpu = machine.gpu()  # {"kind": "cuda" | "simulator" | "none", "name": ..., "driver_cuda": ...}
    facts["gpu"] = gpu["name"] if gpu["kind"] == "cuda" else gpu["kind"]
    if "driver_cuda" in gpu:
        facts["gpu_driver"] = gpu["driver_cuda"]
    return facts


def gpu_environment() -> dict:
    """``environment()`` on a CUDA machine, with what a GPU timing depends on: torch and its CUDA and
    cuDNN, the GPU's name, nvidia-smi's line (driver, memory, max SM clock) and numba's CUDA versions.
    Needs torch with CUDA and a GPU."""
    import subprocess

    import numba
    import torch
    from numba import cuda
    env = environment()
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0),
               numba=numba.__version__, cudnn=torch.backends.cudnn.version())
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
        env["nvidia_smi"] = smi
        env["driver"] = smi.split(",")[1].strip()
    except Exception as error:  # noqa: BLE001 -- a missing nvidia-smi is recorded, not fatal
        env["nvidia_smi"] = f"unavailable: {error}"
    env["cuda_runtime_numba"] = ".".join(map(str, cuda.runtime.get_version()))
    env["cuda_driver_api"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    return env


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
    ``causal_align``, ``window_size``): ``core.flops.attention_flops``.
    ``mask`` describes the mask in words ("causal", "window (8, 0)", ...;
    default "causal" or "none").  ``bytes_moved`` is what the kernel moved
    (its own count, when it keeps one); without it the compulsory traffic of
    ``attention_bytes`` is stored, and ``bytes_source`` says which.  ``layer``
    is what the time measures (one of ``LAYERS``); a launch record carries the
    FLOPs of the problem but no FLOP rate (``tflops``), since its time leaves
    the work out.  Extra keyword fields (tile counts, repeats, ...) are stored as given.
    """
    B, H, Nq, Nk, D = (int(n) for n in shape)
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0, got {time_s}")
    if layer not in LAYERS:
        raise ValueError(f"layer must be one of {LAYERS} (what the time measures), got {layer!r}")
    if "tflops" in extra:
        raise ValueError("tflops is derived from the FLOPs and the time: pass time_s, not tflops")
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
    rate = {"tflops": flops / time_s / 1e12} if layer in RATED_LAYERS else {}
    return {
        "benchmark": benchmark, "run": run, "run_id": run, "impl": impl,
        "device": device or env.get("cpu"), "layer": layer,
        "B": B, "H": H, "Nq": Nq, "Nk": Nk, "D": D, "median_ms": float(time_s) * 1e3,
        "shape": [B, H, Nq, Nk, D], "heads_k": heads_k, "head_dim_v": head_dim_v,
        "dtype": dtype.name, "mask": mask or ("causal" if causal else "none"), "causal": bool(causal),
        "block_q": block_q, "block_k": block_k,
        "time_s": float(time_s), "flops": flops, **rate,
        "bytes_moved": int(bytes_moved), "bytes_source": source,
        **extra,
        "environment": env,
    }


class RecordFile:
    """A JSON-lines record file opened for appending (``with RecordFile(path) as out: out.write(rec)``).

    Each record is one line, keys sorted, flushed at once, so a run cut short keeps
    what it measured.  ``stamp`` holds fields every record of the file carries
    (``run``, ``run_id``, ``environment``, ...); a record's own fields win.
    """

    def __init__(self, path, **stamp):
        self.path, self.stamp, self._file = Path(path), stamp, None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc):
        self._file.close()

    def write(self, rec: dict) -> dict:
        rec = {**self.stamp, **rec}
        self._file.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self._file.flush()
        return rec


def write_records(path, records, **stamp) -> list:
    """Append every record of ``records`` to ``path`` (``RecordFile``, with ``stamp``); returns them as written."""
    with RecordFile(path, **stamp) as out:
        return [out.write(rec) for rec in records]


def append_record(path, **fields) -> dict:
    """Build ``record(**fields)`` and append it to the JSON-lines file ``path``; returns it."""
    return write_records(path, [record(**fields)])[0]


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
