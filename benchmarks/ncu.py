"""The command line that runs a benchmark's child process under Nsight Compute (chapter 10's counters).

``gpu_traffic.py`` and ``gpu_counters.py`` both re-run themselves with ``--child ...``
under ncu and read its raw CSV page; this is the one place that command is built.
"""
from __future__ import annotations

import sys


def command(ncu, metrics, script, child_args, tuned=None) -> list:
    """``script`` run by this Python with ``child_args`` under ``ncu``: the GPU's own clocks
    (``--clock-control none``), only the range the child marks (``--profile-from-start off``),
    ``metrics`` on ncu's raw CSV page, and ``--tuned TUNED`` passed on when given."""
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
            "--metrics", ",".join(metrics), sys.executable, str(script), *child_args] + \
        (["--tuned", tuned] if tuned else [])
