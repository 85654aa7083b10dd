"""What a compiled loop's SIMD code is made of: its multiply-adds counted by register width.

x86's vector registers are xmm (128 bits: 4 float32 lanes), ymm (256: 8) and
zmm (512: 16, AVX-512).  A scalar FMA (``vfmadd231ss``) also names an xmm
register but works on one lane, so width alone does not say how much work an
instruction does: ``fma_table`` keys each count by width, packed or scalar, and
whether one operand is memory, where the accumulator of a loop LLVM could not
keep in a register shows up (it is loaded, and stored back, on every pass).

    asm = next(iter(kernel.inspect_asm().values()))
    simd.fma_table(asm)    # {"zmm packed memory": 4, "scalar register": 12, ...}
"""
from __future__ import annotations

import re
from collections import Counter

_FMA = re.compile(r"^\s*(v?f(?:n)?m(?:add|sub)\w*)\s+(.*)$")
_REGISTER = re.compile(r"%([xyz]mm)\d+")


def fma_kind(line: str) -> str | None:
    """"zmm packed register", "ymm packed memory", "scalar register", ... for one line of AT&T
    assembly that is a fused multiply-add; None for any other line."""
    found = _FMA.match(line)
    if not found or not found.group(1).startswith("vf"):
        return None
    mnemonic, operands = found.groups()
    operand = "memory" if "(" in operands else "register"
    if mnemonic.endswith(("ss", "sd")):
        return f"scalar {operand}"
    widths = _REGISTER.findall(operands)
    return f"{widths[-1] if widths else '?'} packed {operand}"


def fma_table(asm: str) -> dict:
    """The FMAs of ``asm`` counted by ``fma_kind``, most frequent first."""
    return dict(Counter(kind for kind in map(fma_kind, asm.splitlines()) if kind).most_common())


def register_widths(asm: str) -> dict:
    """How often ``asm`` names an xmm, a ymm and a zmm register."""
    return {width: len(re.findall(rf"%{width}\d+", asm)) for width in ("xmm", "ymm", "zmm")}
