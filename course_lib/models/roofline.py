"""The roofline: how fast a kernel can be, from its FLOPs and the bytes it moves.

A kernel that does ``F`` FLOPs and moves ``B`` bytes between DRAM (HBM) and the
chip cannot finish sooner than either of

    F / peak_flops        (the compute roof)      B / bandwidth     (the memory roof)

so its attainable speed at arithmetic intensity ``I = F / B`` FLOP/byte is

    attainable(I) = min(peak_flops, I * bandwidth)

The two roofs meet at the ridge point ``I* = peak_flops / bandwidth``: a kernel
below it is memory-bound, above it compute-bound.  The machines' figures are
the presets of ``core.hardware`` (``Hardware.attainable`` and ``ridge``), or
this machine measured (``models.measure``); ``views.roofline_plot`` draws them.

Which bytes?  A GPU has three levels (registers / shared memory, L2, HBM).
``time_bound`` divides whatever bytes it is given by the DRAM bandwidth, so it
is a true bound ("no kernel can beat it") only for bytes that must cross DRAM:
the compulsory traffic (Q, K, V read once, O written once, ``iomodel.levels``).
The two-level count of ``iomodel.attention_io`` is traffic between the SMs and
L2-plus-HBM; divided by the HBM bandwidth it is an *estimate* that charges
every K / V re-read to HBM, and good kernels beat it (``ATTENTION_SPEEDS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.hardware import MEASURED, PAPER, hardware
from .measure import Measurement


@dataclass(frozen=True)
class Bound:
    """The least time some bytes and FLOPs take on a machine, and what sets it."""

    compute_s: float
    memory_s: float
    exp_s: float  # 0 when the machine has no exp figure
    seconds: float
    limiter: str  # "compute", "memory" or "exp"
    flops_per_s: float  # the attainable speed: FLOPs / seconds


def time_bound(traffic, hw, dtype="float16", *, source: str = "datasheet", include_exp: bool = True) -> Bound:
    """max(FLOPs / peak, bytes / DRAM bandwidth, exps / exp rate) for anything with flops, bytes and exps.

    A true lower bound only when ``traffic.bytes`` must all cross DRAM (the
    compulsory traffic, ``iomodel.levels(...).compulsory_bytes``).  Given the
    two-level count (``iomodel.attention_io``), it is an estimate that charges
    every re-read to HBM, which kernels whose blocks share K / V in L2 beat.
    """
    hw = hardware(hw) if not isinstance(hw, Measurement) else hw.as_hardware()
    name = hw.rate_dtype(dtype)
    terms = {"compute": traffic.flops / hw.peak(name, source),
             "memory": traffic.bytes / hw.memory_bandwidth(source),
             "exp": traffic.exps / float(hw.exp_per_s) if include_exp and hw.exp_per_s is not None else 0.0}
    limiter = max(terms, key=terms.get)
    seconds = terms[limiter]
    return Bound(terms["compute"], terms["memory"], terms["exp"], seconds, limiter,
                 traffic.flops / seconds if seconds else math.inf)


@dataclass(frozen=True)
class _Bytes:
    flops: float
    bytes: float
    exps: float


def attention_bounds(lv, hw, dtype="float16", *, source: str = "datasheet") -> dict:
    """For an ``iomodel.Levels``: the true bound (compulsory HBM bytes) and the two-level estimate.

    ``"bound"``: no kernel can beat it (it must move at least Q, K, V and O
    through DRAM and do the FLOPs and exponentials); ``"two_level"``: the
    same FLOPs with every byte of the two-level count through DRAM, what a
    kernel reaches when L2 catches none of the K / V re-reads.
    """
    exps = lv.on_chip.exps
    return {"bound": time_bound(_Bytes(lv.flops, lv.compulsory_bytes, exps), hw, dtype, source=source),
            "two_level": time_bound(_Bytes(lv.flops, lv.on_chip.bytes, exps), hw, dtype, source=source)}


# Published and measured attention speeds, to set beside the model (never mixed with it).
ATTENTION_SPEEDS = [
    dict(label="FlashAttention-3, fp16 forward, H100 SXM5 (published)", machine="h100_sxm", dtype="float16",
         seqlen=8192, head_dim=128, tflops=646.0, kind=PAPER, date="",
         source="Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608), forward speed at head dim 128, not causal, "
                "sequence length 8k (its 740 TFLOP/s peak is at head dim 256)"),
    # run 20261207T183811+0000 of benchmarks/gpu_peaks.py (notebooks/records/gpu_peaks.jsonl)
    dict(label="PyTorch SDPA cuDNN, fp16, H200 (measured 2026-12-07)", machine="h200", dtype="float16",
         seqlen=8192, head_dim=128, batch=2, heads=16, tflops=604.8, kind=MEASURED, date="2026-12-07",
         source="measured by the course's authors on an NVIDIA H200: torch 2.11, N=8192, D=128, B=2, H=16, "
                "run 20261207T183811+0000"),
    dict(label="PyTorch SDPA flash (FA2), fp16, H200 (measured 2026-12-07)", machine="h200", dtype="float16",
         seqlen=8192, head_dim=128, batch=2, heads=16, tflops=347.3, kind=MEASURED, date="2026-12-07",
         source="measured by the course's authors on an NVIDIA H200: torch 2.11, N=8192, D=128, B=2, H=16, "
                "run 20261207T183811+0000"),
]
