"""A pytest plugin that records what happened to each notebook cell under nbval.

    python -m pytest --nbval --nbval-current-env -p course_lib.grading.nbval_record \\
        --cell-records records.jsonl exercises/01_naive_attention.ipynb

nbval reports a failing cell as a pytest failure with a long, coloured text;
the exercise tests need to know *which* cell (by id) failed and
*why* (a check that failed, a missing answer, a timeout, a dead kernel).  This
plugin appends one JSON object per line to the ``--cell-records`` file:

    {"event": "kernel", "pid": 1234}                       the kernel started
    {"event": "start", "id": "a1b2", "cell": 3}            cell 3 began to run
    {"event": "end", "id": "a1b2", "cell": 3, "outcome": "failed",
     "kind": "exception", "ename": "CheckFailed", "evalue": "FAIL ..."}

``kind`` is one of ``exception``, ``timeout``, ``output_mismatch``,
``kernel_died`` (it died while running this cell), ``kernel_dead`` (it was
already dead) or ``internal``; it is absent for cells that passed or were
skipped.  Each line is written and flushed at once, so a run killed from
outside still leaves everything up to the cell that was running.

With ``--ignore-stderr`` it leaves warnings out of nbval's comparison of
outputs (a warning is not a wrong answer).

It also teaches nbval to notice a dead kernel: nbval waits for a reply for the
whole cell timeout even when the kernel has crashed (a segfault), and then
reports a timeout.  Here its waits are cut into one-second slices that check
that the kernel is still alive, so a crash is reported at once, as a crash.
"""
from __future__ import annotations

import json
import sys
import time
from queue import Empty

import pytest

# nbformat imports jsonschema, which imports rfc3987_syntax when it is installed
# (JupyterLab pulls it in); that import builds a parser and costs seconds per
# run, for URI formats that notebook validation never checks.  This plugin is
# loaded before nbval, so it can spare every graded run that cost.
sys.modules.setdefault("rfc3987_syntax", None)

_PATH_KEY = pytest.StashKey[str]()


class KernelDied(RuntimeError):
    """The kernel process exited while a cell was running."""


def pytest_addoption(parser):
    group = parser.getgroup("nbval")
    group.addoption("--cell-records", metavar="PATH", default=None,
                    help="append each notebook cell's outcome to PATH as JSON lines (course_lib.grading.nbval_record)")
    group.addoption("--ignore-stderr", action="store_true",
                    help="compare cell outputs without their stderr streams (course_lib.grading.nbval_record)")


def pytest_configure(config):
    path = config.getoption("cell_records")
    if path:
        config.stash[_PATH_KEY] = path
    _watch_for_dead_kernels()
    if config.getoption("ignore_stderr"):
        _compare_without_stderr()


def _write(config, **record):
    path = config.stash.get(_PATH_KEY, None)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def _watch_for_dead_kernels():
    """Make nbval's waits for kernel messages raise KernelDied when the kernel is gone."""
    from nbval.kernel import RunningKernel

    original = RunningKernel.get_message
    if getattr(original, "_watches_kernel", False):
        return

    def get_message(self, stream, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                return original(self, stream, timeout=left)
            except Empty:
                if not self.is_alive():
                    raise KernelDied("the kernel died while running this cell (a crash?)") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    get_message._watches_kernel = True
    RunningKernel.get_message = get_message


def _compare_without_stderr():
    """Leave stderr out of nbval's output comparison.

    A correct answer may still warn (``np.exp(-inf - -inf)`` on a fully masked
    row prints a RuntimeWarning before ``np.where`` fixes the row); the check's
    verdict is its stdout line and whether it raised, not the warnings.
    """
    from nbval.plugin import IPyNbCell

    original = IPyNbCell.compare_outputs
    if getattr(original, "_ignores_stderr", False):
        return

    def compare_outputs(self, test, ref, skip_compare=None):
        def keep(outputs):
            return [o for o in outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
        return original(self, keep(test), keep(ref), skip_compare)

    compare_outputs._ignores_stderr = True
    IPyNbCell.compare_outputs = compare_outputs


def _is_cell(item) -> bool:
    return hasattr(item, "cell") and hasattr(item, "cell_num")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _is_cell(item):
        kernel = getattr(item.parent, "kernel", None)
        if kernel is not None and not getattr(item.parent, "_pid_recorded", False):
            pid = getattr(getattr(getattr(kernel, "km", None), "provisioner", None), "pid", None)
            _write(item.config, event="kernel", pid=pid)
            item.parent._pid_recorded = True
        _write(item.config, event="start", id=item.cell.get("id"), cell=item.cell_num)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if not _is_cell(item) or (call.when != "call" and call.excinfo is None):
        return
    record = {"event": "end", "id": item.cell.get("id"), "cell": item.cell_num,
              "outcome": "passed" if call.excinfo is None else "failed"}
    if call.excinfo is not None:
        if call.excinfo.errisinstance(pytest.skip.Exception):
            record["outcome"] = "skipped"
        else:
            record.update(_classify(item, call.excinfo.value))
    _write(item.config, **record)


def _classify(item, exc) -> dict:
    """What kind of failure ``exc`` (raised by nbval's runtest) is."""
    message = str(exc)
    if isinstance(exc, KernelDied):
        return {"kind": "kernel_died", "evalue": message}
    if message.startswith("Kernel dead"):
        return {"kind": "kernel_dead", "evalue": message}
    if message.startswith("Timeout"):
        return {"kind": "timeout", "evalue": message}
    if message == "Cell outputs differ":
        return {"kind": "output_mismatch", "evalue": message}
    errors = [o for o in (getattr(item, "test_outputs", None) or []) if o.get("output_type") == "error"]
    if errors:
        return {"kind": "exception", "ename": errors[-1].get("ename", ""), "evalue": errors[-1].get("evalue", "")}
    return {"kind": "internal", "ename": type(exc).__name__, "evalue": message}
