"""Nsight Compute (ncu), as chapter 10's and 11's counter benchmarks run it.

A counter benchmark re-runs itself with ``--child ...`` under ncu, which profiles
the range the child marks and prints its raw CSV page: ``command`` builds that
command line, ``kernel_rows`` reads the page back, one row per profiled kernel.
The counters are not timings (ncu replays each kernel once per metric pass).
"""
from __future__ import annotations

import csv
import io
import sys


def command(ncu, metrics, script, child_args, tuned=None) -> list:
    """``script`` run by this Python with ``child_args`` under ``ncu``: the GPU's own clocks
    (``--clock-control none``), only the range the child marks (``--profile-from-start off``),
    ``metrics`` on ncu's raw CSV page, and ``--tuned TUNED`` passed on when given."""
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
            "--metrics", ",".join(metrics), sys.executable, str(script), *child_args] + \
        (["--tuned", tuned] if tuned else [])


def _number(text) -> bool:
    return text.replace(",", "").replace(".", "").isdigit()


def kernel_rows(text, metrics) -> list:
    """One {metric: value} per kernel ncu profiled, in launch order (its --csv --page raw output);
    a row whose first metric is not a number (ncu's units line) is not a kernel."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    rows = [r for r in rows if r.get("Kernel Name") and _number(r.get(metrics[0], ""))]
    return [{"kernel": r["Kernel Name"][:80],
             **{m: float(r[m].replace(",", "")) for m in metrics if _number(r.get(m, ""))}}
            for r in rows]
