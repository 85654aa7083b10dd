"""What a checked launch found: one ``Finding`` per problem, gathered in a ``Report``."""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("race", "barrier", "out_of_bounds", "uninitialized", "integer_overflow")


@dataclass
class Finding:
    """One problem, as the first thread that showed it saw it; ``count`` says how often it recurred."""
    kind: str                  # one of KINDS
    message: str               # the paragraph a learner reads: who, what, where, and what to do
    block: tuple               # blockIdx of the thread that showed it
    thread: tuple              # its threadIdx
    array: str | None = None   # the array's name, e.g. "shared array `tile`"
    index: tuple | None = None
    line: int | None = None    # the source line of the access (or barrier)
    count: int = 1

    def __str__(self):
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"{self.kind}{times}: {self.message}"


@dataclass
class Report:
    """What one checked launch found.  ``str(report)``: the verdict line, then one paragraph per problem."""
    kernel: str
    griddim: tuple
    blockdim: tuple
    findings: list = field(default_factory=list)
    intervals: int = 0          # barrier intervals run, summed over blocks
    traffic: dict = field(default_factory=dict)  # {"global reads": n, "global writes": n, "shared reads": ...}
    global_reads: dict = field(default_factory=dict)  # reads of each global array, by argument name: {"k": n, ...}
    # barrier intervals (summed over blocks) in which a thread read global memory and later shared
    # memory: a prefetch's loads of the next tile, issued before the arithmetic on this one
    prefetch_intervals: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def kinds(self) -> set:
        return {f.kind for f in self.findings}

    def launch(self) -> str:
        grid, block = (d[0] if len(d) == 1 else d for d in (self.griddim, self.blockdim))
        return f"{self.kernel}[grid {grid}, block {block}]"

    def __str__(self):
        if self.ok:
            moved = ", ".join(f"{n} {what if n > 1 else what[:-1]}" for what, n in self.traffic.items() if n)
            return (f"cudacheck {self.launch()}: no races, barrier errors, out-of-bounds or uninitialized "
                    f"reads ({moved or 'no memory accesses'})")
        n = len(self.findings)
        lines = [f"cudacheck {self.launch()}: {n} problem{'s' if n > 1 else ''}"]
        lines += [f"- {f}" for f in self.findings]
        return "\n".join(lines)


class KernelError(RuntimeError):
    """The kernel's own Python code raised; the message names the thread and the line."""


class Findings:
    """The findings of one launch, in the order they showed (``.list``): a problem seen again counts, once listed."""

    def __init__(self, grid):
        self.grid, self.list, self._seen = grid, [], {}

    def add(self, kind, key, thread, message, array=None, index=None, line=None):
        """Record a ``kind`` problem that ``thread`` showed; ``key`` says which others are the same one."""
        key = (kind,) + key
        if key in self._seen:
            self._seen[key].count += 1
            return
        if index is not None:
            index = tuple(index) if isinstance(index, tuple) else (index,)
        finding = Finding(kind, message, thread.blockIdx[:self.grid.gridnd], thread.threadIdx[:self.grid.blocknd],
                          array, index, line)
        self._seen[key] = finding
        self.list.append(finding)
