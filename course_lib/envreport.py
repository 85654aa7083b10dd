"""What this machine is: the versions, the CPU, the GPU (or the simulator).

Chapter 00 prints it so that a learner knows which kernels will run here, and
the benchmarks store ``collect()`` beside every record so that a timing always
says where it came from.

    from course_lib import envreport
    envreport.report()          # prints one "name: value" line per fact
    facts = envreport.collect()  # the same facts as a dict
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata

# Distributions whose versions decide what a notebook prints and compiles.
PACKAGES = ("numpy", "numba", "numba-cuda", "ml_dtypes", "course_lib")


def package_version(name: str) -> str:
    """Installed version of distribution ``name``, or "not installed"."""
    if name == "course_lib":  # an editable install may lag behind the source
        from . import __version__
        return __version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


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
    except Exception as exc:  # numba-cuda missing or broken
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
        except Exception:
            pass
        try:
            major, minor = cuda.cudadrv.driver.driver.get_version()
            info["driver_cuda"] = f"{major}.{minor}"
        except Exception:
            pass
        return info
    except Exception as exc:  # a driver that is present but broken
        return {"kind": "none", "name": f"CUDA device unusable ({type(exc).__name__}: {exc})"}


def collect() -> dict:
    """Every fact of the report, as a flat dict of strings, ints and dicts."""
    from . import available_impls
    facts = {
        "python": platform.python_version(),
        **{name: package_version(name) for name in PACKAGES},
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu": cpu_model(),
        "cpu_cores": cpu_cores(),
        "gpu": gpu(),
        "impls": available_impls(),
        "date": datetime.date.today().isoformat(),
    }
    return facts


def _major_minor(version: str) -> tuple:
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return ()


def notes(facts: dict) -> list:
    """Known problems with this combination of versions, each with what to do."""
    found = []
    numpy, numba_cuda = _major_minor(facts["numpy"]), _major_minor(facts["numba-cuda"])
    if numpy >= (2, 5) and numba_cuda and numba_cuda < (0, 31):
        found.append(f"numpy {facts['numpy']} breaks @cuda.jit in numba-cuda {facts['numba-cuda']} "
                     "(np.row_stack is gone): install the course's pins (numpy < 2.5), e.g. `make lab`")
    if facts["numba-cuda"] == "not installed":
        found.append("numba-cuda is missing: chapter 09 needs it (`make lab` installs it)")
    return found


def format_report(facts: dict) -> str:
    """The report as aligned "name: value" lines."""
    cores = facts["cpu_cores"]
    core_text = f"{cores['logical']} logical"
    if cores["usable"] != cores["logical"]:
        core_text += f", {cores['usable']} usable by this process"
    g = facts["gpu"]
    gpu_text = g["name"]
    if g["kind"] == "cuda":
        extras = [g.get("compute_capability"),
                  f"{g['memory_gib']} GiB" if "memory_gib" in g else None,
                  f"driver CUDA {g['driver_cuda']}" if "driver_cuda" in g else None]
        gpu_text += " (" + ", ".join(e for e in extras if e) + ")"
    rows = [("python", facts["python"])]
    rows += [(name, facts[name]) for name in PACKAGES]
    rows += [("os", facts["os"]), ("cpu", facts["cpu"]), ("cpu cores", core_text),
             ("gpu", f"[{g['kind']}] {gpu_text}"), ("impls", ", ".join(facts["impls"]))]
    rows += [("note", text) for text in notes(facts)]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}} : {value}" for name, value in rows)


def report(file=None) -> None:
    """Print the environment report (to stdout unless ``file`` is given)."""
    print(format_report(collect()), file=file or sys.stdout)


if __name__ == "__main__":
    report()
