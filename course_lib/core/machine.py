"""What this machine is: its CPU, its cores, and what a ``@cuda.jit`` kernel runs on here.

Facts read off the machine at the moment they are asked for; ``bench.envreport``
adds the versions and prints them, and ``models.measure`` names the CPU it
measured with ``cpu_model``.
"""
from __future__ import annotations

import functools
import hashlib
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


# (vendor, family, first model, last model) -> microarchitecture; family and model as /proc/cpuinfo
# prints them (decimal).  What a timing on this CPU can reach depends on it (AVX-512 on a 256-bit or a
# 512-bit datapath, one or two FMA units), and a marketing name such as "AMD EPYC" does not say it.
MICROARCHITECTURES = (
    ("AuthenticAMD", 23, 0x00, 0x2F, "Zen / Zen+"),
    ("AuthenticAMD", 23, 0x30, 0xFF, "Zen 2"),
    ("AuthenticAMD", 25, 0x00, 0x0F, "Zen 3"),
    ("AuthenticAMD", 25, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 25, 0x20, 0x5F, "Zen 3"),
    ("AuthenticAMD", 25, 0x60, 0xAF, "Zen 4"),
    ("AuthenticAMD", 26, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 0x3C, 0x3C, "Haswell"),
    ("GenuineIntel", 6, 0x3F, 0x3F, "Haswell"),
    ("GenuineIntel", 6, 0x4F, 0x4F, "Broadwell"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP / Cascade Lake / Cooper Lake"),
    ("GenuineIntel", 6, 0x6A, 0x6A, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x6C, 0x6C, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"),
    ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAD, "Granite Rapids"),
)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
              "avx512_bf16", "avx512_fp16", "amx_tile")


def microarchitecture(vendor, family, model) -> str | None:
    """The microarchitecture of a CPU by its cpuid vendor, family and model, or None where the table
    above does not know it."""
    return next((name for v, f, first, last, name in MICROARCHITECTURES
                 if v == vendor and f == family and first <= model <= last), None)


def cpu_cores() -> dict:
    """Logical cores of the machine, and those this process may run on."""
    total = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = total
    return {"logical": total, "usable": usable}


def cpu_identity() -> dict:
    """What a CPU timing depends on beyond the marketing name: vendor, family / model / stepping, the
    microarchitecture they give (``microarchitecture``), the SIMD extensions it has (of ``SIMD_FLAGS``), a
    hash of all its feature flags and the cores.  Two hosts that both say "AMD EPYC" can be different chips,
    or the same chip with a hypervisor hiding AVX-512 from one of them; their times are not comparable.
    Linux reads /proc/cpuinfo (the first processor's block says it for all); elsewhere only the cores."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    if "vendor_id" not in fields:
        return {"vendor": platform.processor() or platform.machine() or "unknown", **cpu_cores()}
    vendor = fields["vendor_id"]
    family, model, stepping = (int(fields[k]) if fields.get(k, "").isdigit() else None
                               for k in ("cpu family", "model", "stepping"))
    flags = sorted(fields.get("flags", "").split())
    return {"vendor": vendor, "family": family, "model": model, "stepping": stepping,
            "microarchitecture": microarchitecture(vendor, family, model),
            "simd": [flag for flag in SIMD_FLAGS if flag in flags],
            "flags_sha": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else "unknown",
            **cpu_cores()}


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
