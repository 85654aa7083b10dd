"""What a block costs a multiprocessor: Hopper's limits and the occupancy they allow.

The hardware facts the CUDA steps need, in one place: ``SMS``, ``SM_LIMITS``
and ``occupancy`` (a model of the CUDA occupancy calculator, not a
measurement).
"""
from __future__ import annotations

SMS = 132                  # multiprocessors of an H100 / H200 (``decode_splits`` asks the GPU when it can)
SM_LIMITS = dict(regs=65536, shared=233472, warps=64, blocks=32, reserved_shared=1024)  # Hopper (sm_90)


def occupancy(regs, shared, threads, limits=SM_LIMITS):
    """Blocks and warps one multiprocessor holds for a kernel's registers / thread, shared bytes /
    block and threads / block, and which resource sets the limit (registers are allocated per warp
    in units of 256).  A model of the CUDA occupancy calculator, not a measurement."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by = {
        "warps": limits["warps"] // warps,
        "registers": limits["regs"] // (regs_per_warp * warps),
        "shared": limits["shared"] // (shared + limits["reserved_shared"]) if shared else limits["blocks"],
        "blocks": limits["blocks"],
    }
    blocks = min(by.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "occupancy": blocks * warps / limits["warps"], "limited_by": min(by, key=by.get)}
