"""What a block costs a multiprocessor, in the terms the CUDA steps' records use.

The facts are the H200 preset's (``core.hardware``): its SM count and per-SM
limits, and the one occupancy model there.  The names of the limits are the
ones the committed records of chapter 10 carry ("warps", "registers",
"shared", "blocks").
"""
from __future__ import annotations

from ...core import hardware

H200 = hardware.hardware("h200")
SMS = int(float(H200.units))   # multiprocessors (``decode_splits`` asks the GPU when it can)
_RECORD_NAMES = {"threads": "warps", "shared memory": "shared"}


def occupancy(regs, shared, threads, hw=H200):
    """Blocks and warps one multiprocessor holds for a kernel's registers / thread, shared bytes /
    block and threads / block, and which resource sets the limit (a tie goes to warps, then
    registers, shared memory, blocks).  A model of the CUDA occupancy calculator, not a measurement."""
    occ = hardware.occupancy(hw, regs, shared, threads, ties=("threads", "registers", "shared memory", "blocks"))
    return {"blocks_per_sm": occ.blocks, "warps_per_sm": occ.warps, "occupancy": occ.fraction,
            "limited_by": _RECORD_NAMES.get(occ.limiter, occ.limiter)}
