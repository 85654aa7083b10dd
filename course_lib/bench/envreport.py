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
import platform
import sys
import textwrap
from importlib import metadata

from ..core.machine import cache_sizes, cpu_cores, cpu_model, gpu

# Distributions whose versions decide what a notebook prints and compiles.
PACKAGES = ("numpy", "numba", "numba-cuda", "ml_dtypes", "course_lib")


def package_version(name: str) -> str:
    """Installed version of distribution ``name``, or "not installed"."""
    if name == "course_lib":  # an editable install may lag behind the source
        from .. import __version__
        return __version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def collect() -> dict:
    """Every fact of the report, as a flat dict of strings, ints and dicts."""
    from .. import available_impls
    facts = {
        "python": platform.python_version(),
        **{name: package_version(name) for name in PACKAGES},
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu": cpu_model(),
        "cpu_cores": cpu_cores(),
        "cpu_caches": {f"L{level}": size for level, size in cache_sizes().items()},
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


WIDTH = 110     # JupyterLab's width: a longer value goes on over lines indented to the values' column


def format_report(facts: dict) -> str:
    """The report as aligned "name : value" lines, none wider than ``WIDTH`` (a long value, such as the list
    of impls, goes on over lines that start with blanks)."""
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
    lines = []
    for name, value in rows:
        head = f"{name:<{width}} : "
        parts = textwrap.wrap(str(value), WIDTH - len(head), break_long_words=False, break_on_hyphens=False)
        lines.append(head + (parts[0] if parts else ""))
        lines += [" " * len(head) + part for part in parts[1:]]
    return "\n".join(lines)


def report(file=None) -> None:
    """Print the environment report (to stdout unless ``file`` is given)."""
    print(format_report(collect()), file=file or sys.stdout)


if __name__ == "__main__":
    report()
