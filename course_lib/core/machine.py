"""What this machine is: its CPU, its cores, and what a ``@cuda.jit`` kernel runs on here.

Facts read off the machine at the moment they are asked for; ``bench.envreport``
adds the versions and prints them, and ``models.measure`` names the CPU it
measured with ``cpu_model``.
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys


def cpu_model() -> str:
    """The CPU's marketing name, as the operating system reports it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "Hardware"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_cores() -> dict:
    """Logical cores of the machine, and those this process may run on."""
    total = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = total
    return {"logical": total, "usable": usable}


def cache_sizes() -> dict:
    """Data cache bytes per core by level, e.g. {1: 32768, 2: 1048576, 3: 33554432}
    (Linux sysfs; empty where the system does not say).  Level 3 is shared.
    Read once a process: a kernel asks on every call."""
    return dict(_cache_sizes())


@functools.lru_cache(maxsize=1)
def _cache_sizes() -> dict:
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = {}
    try:
        for index in sorted(os.listdir(base)):
            if not index.startswith("index"):
                continue
            with open(f"{base}/{index}/type") as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(f"{base}/{index}/level") as f:
                level = int(f.read())
            with open(f"{base}/{index}/size") as f:
                size = f.read().strip()
            units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
            sizes[level] = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except (OSError, ValueError):
        pass
    return sizes


def simulator_enabled() -> bool:
    """True when numba's CUDA simulator replaces the GPU (NUMBA_ENABLE_CUDASIM=1).

    numba reads the variable once, when it is imported, so the notebook's
    kernel must be started with it set.
    """
    try:
        from numba import config
        return bool(getattr(config, "ENABLE_CUDASIM", False))
    except ImportError:
        return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def gpu() -> dict:
    """What ``@cuda.jit`` kernels will run on here.

    ``kind`` is "cuda" (a real device: its name, compute capability, memory
    and driver), "simulator" (numba's CUDA simulator, Python threads on the
    CPU) or "none" (numba-cuda missing, or no usable device and no simulator).
    """
    if simulator_enabled():
        return {"kind": "simulator", "name": "numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"}
    try:
        from numba import cuda
    except Exception as exc:  # noqa: BLE001 -- numba-cuda missing or broken: reported, the report goes on
        return {"kind": "none", "name": f"numba.cuda unavailable ({type(exc).__name__}: {exc})"}
    try:
        if not cuda.is_available():
            return {"kind": "none", "name": "no CUDA device (set NUMBA_ENABLE_CUDASIM=1 for the simulator)"}
        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        info = {"kind": "cuda", "name": name,
                "compute_capability": "sm_%d%d" % tuple(device.compute_capability)}
        try:
            free, total = cuda.current_context().get_memory_info()
            info["memory_gib"] = round(total / 2**30, 1)
        except Exception:  # noqa: BLE001 -- an optional detail: left out where the driver won't say
            pass
        try:
            major, minor = cuda.cudadrv.driver.driver.get_version()
            info["driver_cuda"] = f"{major}.{minor}"
        except Exception:  # noqa: BLE001 -- an optional detail: left out where the driver won't say
            pass
        return info
    except Exception as exc:  # noqa: BLE001 -- a driver that is present but broken: reported, not raised
        return {"kind": "none", "name": f"CUDA device unusable ({type(exc).__name__}: {exc})"}
