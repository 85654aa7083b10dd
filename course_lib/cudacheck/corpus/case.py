"""What one corpus entry holds: a kernel with a planted bug, its fixed twin, a launch and the answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    bug: str                 # the planted bug, in a learner's words
    buggy: object            # the @cuda.jit kernel with the bug
    fixed: object            # its twin, with the bug fixed
    griddim: object
    blockdim: object
    args: Callable           # () -> fresh launch arguments
    expect: str              # the cudacheck kind the bug must raise
    spec: Callable           # args -> {argument position: the array the fixed twin leaves there}
    blind_spot: str = ""     # why a compute-sanitizer tool cannot see this bug, where its documents say


def ramp(n):
    """n small float32 values, -6 to 6 and round again: exact sums in any order."""
    return np.arange(n, dtype=np.float32) % 13 - 6.0
