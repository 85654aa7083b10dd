"""The roofline: how fast a kernel can be, from its FLOPs and the bytes it moves.

A kernel that does ``F`` FLOPs and moves ``B`` bytes between DRAM (HBM) and the
chip cannot finish sooner than either of

    F / peak_flops        (the compute roof)      B / bandwidth     (the memory roof)

so its attainable speed at arithmetic intensity ``I = F / B`` FLOP/byte is

    attainable(I) = min(peak_flops, I * bandwidth)

The two roofs meet at the ridge point ``I* = peak_flops / bandwidth``: a kernel
below it is memory-bound, above it compute-bound.

``HARDWARE`` holds presets for real and illustrative machines.  Every number in
them is a ``Figure``: a value with its unit, its source and its kind, so a
datasheet peak is never mistaken for a measurement:

- ``datasheet``: the vendor's published peak (dense, no sparsity);
- ``paper``: a figure quoted from a paper, cited;
- ``measured``: measured by the course on a named machine on a named date;
- ``illustrative``: a class-typical figure for a kind of device, not a product.

Which bytes?  A GPU has three levels (registers / shared memory, L2, HBM).
``time_bound`` divides whatever bytes it is given by the DRAM bandwidth, so it
is a true bound ("no kernel can beat it") only for bytes that must cross DRAM:
the compulsory traffic (Q, K, V read once, O written once, ``iomodel.levels``).
The two-level count of ``iomodel.attention_io`` is traffic between the SMs and
L2-plus-HBM; divided by the HBM bandwidth it is an *estimate* that charges
every K / V re-read to HBM, and good kernels beat it (``ATTENTION_SPEEDS``).

``measure_this_machine()`` measures this machine with numpy (copy bandwidth,
matmul FLOP/s, exp throughput) in about a second or two and returns a
``Measurement`` that ``plot_roofline`` can draw beside the presets.
"""
from __future__ import annotations

import datetime
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..core.machine import cpu_model

DATASHEET, PAPER, MEASURED, ILLUSTRATIVE = "datasheet", "paper", "measured", "illustrative"
KINDS = (DATASHEET, PAPER, MEASURED, ILLUSTRATIVE)
KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
TERA, GIGA = 1e12, 1e9


@dataclass(frozen=True)
class Figure:
    """One number about a machine, with where it comes from."""

    value: float
    unit: str
    source: str
    kind: str = DATASHEET
    date: str = ""  # when it was measured (measured figures only)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == MEASURED and not self.date:
            raise ValueError("a measured figure needs the date it was measured")

    def __float__(self):
        return float(self.value)

    def label(self) -> str:
        when = f", {self.date}" if self.date else ""
        return f"{self.kind}{when}: {self.source}"


@dataclass(frozen=True)
class Hardware:
    """A machine as the roofline and the SRAM budget see it.

    ``unit`` is the thing that owns one on-chip SRAM: an SM on an NVIDIA GPU, a
    core (its private L2) on a CPU, the whole NPU, a cluster of RISC-V cores.
    ``peak_flops`` maps a dtype name to FLOP/s.  ``measured`` keeps measured
    figures apart from the datasheet ones, under the same keys
    ("bandwidth", "flops:float32", ...).  GPU-only fields (registers, threads,
    blocks) are None on machines without them.
    """

    key: str
    name: str
    family: str  # "gpu", "cpu", "npu", "riscv"
    peak_flops: dict  # dtype name -> Figure (FLOP/s)
    bandwidth: Figure  # DRAM / HBM bytes per second
    sram_per_unit: Figure  # bytes of on-chip SRAM one tile can use (shared memory per SM, ...)
    units: Figure  # SMs, cores, clusters
    unit_name: str = "SM"
    memory: Figure | None = None  # DRAM / HBM capacity in bytes
    l2: Figure | None = None  # the cache shared by every unit, between their SRAM and DRAM (0: none)
    exp_per_s: Figure | None = None  # exponentials per second (special-function units)
    max_smem_per_block: Figure | None = None
    smem_reserved_per_block: int = 0  # bytes the CUDA runtime keeps per block
    registers_per_unit: Figure | None = None  # 32-bit registers per SM
    max_registers_per_thread: int | None = None
    max_threads_per_unit: int | None = None
    max_blocks_per_unit: int | None = None
    measured: dict = field(default_factory=dict)  # key -> Figure, kind "measured"
    note: str = ""

    # -- the roofline ---------------------------------------------------------
    def peak(self, dtype="float16", source: str = "datasheet") -> float:
        """Peak FLOP/s for ``dtype``; ``source="measured"`` uses a measured figure when there is one."""
        name = _dtype_name(dtype)
        if source == "measured" and f"flops:{name}" in self.measured:
            return float(self.measured[f"flops:{name}"])
        if name not in self.peak_flops:
            raise ValueError(f"{self.name} has no peak for {name}; it has {sorted(self.peak_flops)}")
        return float(self.peak_flops[name])

    def memory_bandwidth(self, source: str = "datasheet") -> float:
        if source == "measured" and "bandwidth" in self.measured:
            return float(self.measured["bandwidth"])
        return float(self.bandwidth)

    def ridge(self, dtype="float16", source: str = "datasheet") -> float:
        """The ridge point, FLOP/byte: the intensity where compute and memory roofs meet."""
        return self.peak(dtype, source) / self.memory_bandwidth(source)

    def attainable(self, intensity, dtype="float16", source: str = "datasheet"):
        """FLOP/s a kernel of this intensity can reach: min(peak, intensity * bandwidth)."""
        return np.minimum(self.peak(dtype, source), np.asarray(intensity, float) * self.memory_bandwidth(source))

    def dtypes(self) -> list:
        return list(self.peak_flops)

    def rate_dtype(self, dtype) -> str:
        """The dtype whose peak applies to ``dtype`` here: itself, else float16 for float8 (converted
        on load), else float32."""
        name = _dtype_name(dtype)
        if name in self.peak_flops:
            return name
        if name.startswith("float8") and "float16" in self.peak_flops:
            return "float16"
        return "float32"

    def figures(self) -> dict:
        """Every figure of this machine by name, datasheet and measured apart."""
        out = {"bandwidth": self.bandwidth, "sram_per_unit": self.sram_per_unit, "units": self.units}
        out.update({f"flops:{k}": v for k, v in self.peak_flops.items()})
        for name in ("memory", "l2", "exp_per_s", "max_smem_per_block", "registers_per_unit"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update({f"measured {k}": v for k, v in self.measured.items()})
        return out


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64", "tf32": "tfloat32",
                "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn"}.get(dtype, dtype)
    return np.dtype(dtype).name


# -- the presets ------------------------------------------------------------------

def _ds(value, unit, source):
    return Figure(value, unit, source, DATASHEET)


def _ill(value, unit, what):
    return Figure(value, unit, f"illustrative figures for a class of device, not a product datasheet ({what})",
                  ILLUSTRATIVE)


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column (dense; sparsity figures halved)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet, SXM column (dense; sparsity figures halved)"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column"
_ADA_WP = "NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 table (dense, FP32 accumulate)"
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (dense; sparsity figures halved)"
_HOPPER_TUNING = "CUDA C++ Programming Guide, compute capability 9.0 table / Hopper tuning guide"
_AMPERE_TUNING = "CUDA C++ Programming Guide, compute capability 8.0 table / Ampere tuning guide"
_ADA_TUNING = "CUDA C++ Programming Guide, compute capability 8.9 table / Ada tuning guide"
_FA3 = ("Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608), section 3: the H100 SXM5's special-function "
        "units compute 3.9 T exponentials per second, beside 989 TFLOP/s of FP16 matmul")
_GPU_MD = "measured by the course's authors on an NVIDIA H200 (numpy 2.4, numba-cuda 0.30.4)"


def _cuda_limits(tuning, smem_kib, smem_block_kib, threads, blocks):
    """The per-SM limits of one compute capability, all from the programming guide."""
    return dict(
        sram_per_unit=_ds(smem_kib * KiB, "B", f"{tuning}: shared memory per SM"),
        max_smem_per_block=_ds(smem_block_kib * KiB, "B", f"{tuning}: shared memory per block (opt-in)"),
        smem_reserved_per_block=1 * KiB,  # the runtime keeps 1 KiB per block on sm_80 and later
        registers_per_unit=_ds(65536, "registers", f"{tuning}: 64K 32-bit registers per SM"),
        max_registers_per_thread=255, max_threads_per_unit=threads, max_blocks_per_unit=blocks)


_HOPPER_WP = "NVIDIA H100 Tensor Core GPU architecture whitepaper (Hopper), H100 SXM5 table"


def _h100_like(key, name, ds, bandwidth, memory, l2, measured=None, note=""):
    """An H100-class part.  L2: 50 MB on the H100 SXM5 (Hopper whitepaper; NVIDIA's "MB" is MiB here);
    TF32: the datasheet's 989 TFLOPS with sparsity, halved."""
    return Hardware(
        key=key, name=name, family="gpu",
        peak_flops={
            "float8_e4m3fn": _ds(1979 * TERA, "FLOP/s", f"{ds}: FP8 Tensor Core (3,958 with sparsity)"),
            "float16": _ds(989.5 * TERA, "FLOP/s", f"{ds}: FP16 Tensor Core (1,979 with sparsity)"),
            "bfloat16": _ds(989.5 * TERA, "FLOP/s", f"{ds}: BF16 Tensor Core (1,979 with sparsity)"),
            "tfloat32": _ds(494.7 * TERA, "FLOP/s", f"{ds}: TF32 Tensor Core (989 with sparsity)"),
            "float32": _ds(67 * TERA, "FLOP/s", f"{ds}: FP32 (no tensor cores)"),
            "float64": _ds(34 * TERA, "FLOP/s", f"{ds}: FP64 (no tensor cores)"),
        },
        bandwidth=_ds(bandwidth * TERA, "B/s", f"{ds}: GPU memory bandwidth"),
        memory=_ds(memory * 1e9, "B", f"{ds}: GPU memory"),
        l2=l2,
        units=_ds(132, "SMs", f"{ds} / Hopper architecture whitepaper: 132 SMs on the SXM5 part"),
        exp_per_s=Figure(3.9 * TERA, "exp/s", _FA3, PAPER),
        measured=measured or {}, note=note,
        **_cuda_limits(_HOPPER_TUNING, 228, 227, 2048, 32))


HARDWARE: dict = {}


def _add(hw: Hardware):
    HARDWARE[hw.key] = hw


_add(_h100_like("h100_sxm", "NVIDIA H100 SXM", _H100_DS, 3.35, 80,
                _ds(50 * MiB, "B", f"{_HOPPER_WP}: 50 MB L2 cache")))
_add(_h100_like(
    "h200", "NVIDIA H200 SXM", _H200_DS, 4.8, 141,
    _ds(50 * MiB, "B", f"{_HOPPER_WP}: 50 MB L2 cache; the H200 is the same GH100 die with HBM3e "
        "(its datasheet lists no L2 size)"),
    measured={
        "bandwidth": Figure(3.8 * TERA, "B/s", f"{_GPU_MD}: device copy, read + write", MEASURED, "2026-11-30"),
        "flops:float32": Figure(51 * TERA, "FLOP/s", f"{_GPU_MD}: cuBLAS fp32 sgemm, TF32 off (SIMT)",
                                MEASURED, "2026-11-30"),
    },
    note="The course's reference GPU. Same chip as the H100, more and faster HBM (HBM3e)."))
_add(Hardware(
    key="a100_80gb", name="NVIDIA A100 80GB SXM", family="gpu",
    peak_flops={
        "float16": _ds(312 * TERA, "FLOP/s", f"{_A100_DS}: FP16 Tensor Core"),
        "bfloat16": _ds(312 * TERA, "FLOP/s", f"{_A100_DS}: BF16 Tensor Core"),
        "tfloat32": _ds(156 * TERA, "FLOP/s", f"{_A100_DS}: TF32 Tensor Core (312 with sparsity)"),
        "float32": _ds(19.5 * TERA, "FLOP/s", f"{_A100_DS}: FP32"),
        "float64": _ds(9.7 * TERA, "FLOP/s", f"{_A100_DS}: FP64"),
    },
    bandwidth=_ds(2.039 * TERA, "B/s", f"{_A100_DS}: GPU memory bandwidth"),
    memory=_ds(80e9, "B", f"{_A100_DS}: GPU memory"),
    l2=_ds(40 * MiB, "B", "NVIDIA A100 Tensor Core GPU architecture whitepaper: 40 MB L2 cache"),
    units=_ds(108, "SMs", "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs"),
    **_cuda_limits(_AMPERE_TUNING, 164, 163, 2048, 32)))
_add(Hardware(
    key="rtx_4090", name="NVIDIA GeForce RTX 4090", family="gpu",
    peak_flops={
        "float16": _ds(165.2 * TERA, "FLOP/s", f"{_ADA_WP}: FP16 Tensor (330.3 with sparsity)"),
        "bfloat16": _ds(165.2 * TERA, "FLOP/s", f"{_ADA_WP}: BF16 Tensor (330.3 with sparsity)"),
        "tfloat32": _ds(82.6 * TERA, "FLOP/s", f"{_ADA_WP}: TF32 Tensor (165.2 with sparsity)"),
        "float32": _ds(82.6 * TERA, "FLOP/s", f"{_ADA_WP}: FP32 shader"),
    },
    bandwidth=_ds(1.008 * TERA, "B/s", f"{_ADA_WP}: memory bandwidth (GDDR6X)"),
    memory=_ds(24e9, "B", f"{_ADA_WP}: 24 GB GDDR6X"),
    l2=_ds(72 * MiB, "B", f"{_ADA_WP}: L2 cache 73,728 KB"),
    units=_ds(128, "SMs", f"{_ADA_WP}: 128 SMs"),
    **_cuda_limits(_ADA_TUNING, 100, 99, 1536, 24)))
_add(Hardware(
    key="l4", name="NVIDIA L4", family="gpu",
    peak_flops={
        "float8_e4m3fn": _ds(242.5 * TERA, "FLOP/s", f"{_L4_DS}: FP8 Tensor Core (485 with sparsity)"),
        "float16": _ds(121 * TERA, "FLOP/s", f"{_L4_DS}: FP16 Tensor Core (242 with sparsity)"),
        "bfloat16": _ds(121 * TERA, "FLOP/s", f"{_L4_DS}: BF16 Tensor Core (242 with sparsity)"),
        "tfloat32": _ds(60 * TERA, "FLOP/s", f"{_L4_DS}: TF32 Tensor Core (120 with sparsity)"),
        "float32": _ds(30.3 * TERA, "FLOP/s", f"{_L4_DS}: FP32"),
    },
    bandwidth=_ds(300 * GIGA, "B/s", f"{_L4_DS}: GPU memory bandwidth"),
    memory=_ds(24e9, "B", f"{_L4_DS}: 24 GB GDDR6"),
    l2=_ds(48 * MiB, "B", "NVIDIA Ada GPU architecture whitepaper: 48 MB L2 on AD104, the L4's die"),
    units=_ds(58, "SMs", "NVIDIA Ada GPU architecture whitepaper / L4 product brief: 58 SMs"),
    **_cuda_limits(_ADA_TUNING, 100, 99, 1536, 24)))
_add(Hardware(
    key="laptop_cpu", name="Laptop-class CPU (8 cores, AVX2)", family="cpu",
    peak_flops={
        # 8 cores x 3 GHz x 2 FMA units x 8 float32 lanes x 2 FLOP; half that for float64.
        "float32": _ill(768 * GIGA, "FLOP/s", "8 cores x 3 GHz x 2 FMA x 8 lanes x 2"),
        "float64": _ill(384 * GIGA, "FLOP/s", "8 cores x 3 GHz x 2 FMA x 4 lanes x 2"),
        # No native half-precision FMA: bf16 / fp16 are converted to float32 and run at its rate.
        "bfloat16": _ill(768 * GIGA, "FLOP/s", "converted to float32, float32 rate"),
        "float16": _ill(768 * GIGA, "FLOP/s", "converted to float32, float32 rate"),
        "tfloat32": _ill(768 * GIGA, "FLOP/s", "no TF32 unit: float32 rate"),
    },
    bandwidth=_ill(100 * GIGA, "B/s", "dual-channel LPDDR5"),
    memory=_ill(16 * GiB, "B", "16 GiB LPDDR5"),
    l2=_ill(24 * MiB, "B", "a last-level cache (L3) shared by the cores"),
    sram_per_unit=_ill(1.25 * MiB, "B", "private L2 per core; L1d is 48 KiB"),
    units=_ill(8, "cores", "8 performance cores"),
    unit_name="core",
    exp_per_s=_ill(8 * 3e9 * 8 / 10, "exp/s", "8 cores x 3 GHz x 8 lanes, ~10 cycles per vector exp"),
    note="A tile lives in a core's L2; the 'SRAM' is a cache, so what a core keeps there is a hope, not a guarantee."))
_add(Hardware(
    key="edge_npu", name="Edge NPU (256 KiB SRAM, DMA-fed)", family="npu",
    peak_flops={
        "int8": _ill(4 * TERA, "OP/s", "a 4 TOPS int8 MAC array"),
        "float16": _ill(1 * TERA, "FLOP/s", "the same array at a quarter of the int8 rate"),
        "bfloat16": _ill(1 * TERA, "FLOP/s", "the same array at a quarter of the int8 rate"),
        "float32": _ill(25 * GIGA, "FLOP/s", "a small float32 vector unit beside the array"),
        "tfloat32": _ill(25 * GIGA, "FLOP/s", "no TF32 unit: the float32 vector unit's rate"),
    },
    bandwidth=_ill(8.5 * GIGA, "B/s", "LPDDR4X shared with the host, reached through DMA"),
    memory=_ill(2 * GiB, "B", "the share of system DRAM the NPU may use"),
    l2=_ill(0, "B", "no cache: DMA moves every tile between DRAM and the scratchpad"),
    sram_per_unit=_ill(256 * KiB, "B", "one scratchpad, filled and drained by DMA"),
    units=_ill(1, "NPU", "one MAC array"),
    unit_name="NPU",
    exp_per_s=_ill(2 * GIGA, "exp/s", "a lookup-table activation unit"),
    note="No caches: software moves every tile in and out of the scratchpad with DMA, so the IO model is exact."))
_add(Hardware(
    key="riscv_manycore", name="Many-core RISC-V (64 cores, shared cluster SRAM)", family="riscv",
    peak_flops={
        "float32": _ill(128 * GIGA, "FLOP/s", "64 cores x 1 GHz x 1 FMA x 2"),
        "float16": _ill(256 * GIGA, "FLOP/s", "2-way packed-SIMD half precision"),
        "bfloat16": _ill(256 * GIGA, "FLOP/s", "2-way packed-SIMD half precision"),
        "float64": _ill(64 * GIGA, "FLOP/s", "64 cores x 1 GHz x 1 FMA x 2, every other cycle"),
        "tfloat32": _ill(128 * GIGA, "FLOP/s", "no TF32 unit: float32 rate"),
    },
    bandwidth=_ill(25.6 * GIGA, "B/s", "one DDR4 channel"),
    memory=_ill(4 * GiB, "B", "4 GiB DDR4"),
    l2=_ill(0, "B", "no cache: each cluster's SRAM is filled and drained by DMA"),
    sram_per_unit=_ill(128 * KiB, "B", "128 KiB SRAM shared by the 8 cores of a cluster, DMA-fed"),
    units=_ill(8, "clusters", "8 clusters of 8 cores"),
    unit_name="cluster",
    exp_per_s=_ill(6.4 * GIGA, "exp/s", "64 cores, ~10 cycles per software exp"),
    note="A tile lives in a cluster's shared SRAM; its 8 cores split the tile's rows."))


def hardware(key_or_hw) -> Hardware:
    """A preset by key (``"h100_sxm"``) or name, or a ``Hardware`` passed through."""
    if isinstance(key_or_hw, Hardware):
        return key_or_hw
    if key_or_hw in HARDWARE:
        return HARDWARE[key_or_hw]
    for hw in HARDWARE.values():
        if hw.name == key_or_hw:
            return hw
    raise ValueError(f"unknown hardware {key_or_hw!r}; presets: {sorted(HARDWARE)}")


def preset_table(dtype="float16") -> list:
    """One row per preset: the figures chapter 02 tabulates, with their kinds."""
    rows = []
    for hw in HARDWARE.values():
        used = hw.rate_dtype(dtype)
        fig = hw.peak_flops[used]
        rows.append(dict(key=hw.key, name=hw.name, dtype=used, peak_tflops=float(fig) / TERA,
                         bandwidth_tbs=float(hw.bandwidth) / TERA, ridge=hw.ridge(used),
                         sram_kib=float(hw.sram_per_unit) / KiB, units=int(float(hw.units)),
                         l2_mib=float(hw.l2) / MiB if hw.l2 is not None else None,
                         tf32_tflops=hw.peak("tfloat32") / TERA if "tfloat32" in hw.peak_flops else None,
                         kind=fig.kind))
    return rows


def format_table(rows) -> str:
    """The preset table as fixed-width text (deterministic, for notebooks)."""
    lines = [f"{'machine':<50}{'dtype':<10}{'peak TFLOP/s':>13}{'TF32':>7}{'TB/s':>8}{'ridge F/B':>11}"
             f"{'SRAM KiB':>10}{'L2 MiB':>8}{'units':>7}  kind"]
    blank = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    for r in rows:
        lines.append(f"{r['name']:<50}{r['dtype']:<10}{r['peak_tflops']:>13.4g}{blank(r['tf32_tflops'], '.4g'):>7}"
                     f"{r['bandwidth_tbs']:>8.3g}{r['ridge']:>11.4g}{r['sram_kib']:>10.4g}"
                     f"{blank(r['l2_mib'], '.4g'):>8}{r['units']:>7}  {r['kind']}")
    return "\n".join(lines)


# -- the roofline bound ---------------------------------------------------------------

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
         seqlen=8192, head_dim=128, tflops=740.0, kind=PAPER, date="",
         source="Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608): up to about 740 TFLOP/s in FP16"),
    dict(label="PyTorch SDPA cuDNN, fp16, H200 (measured 2026-11-30)", machine="h200", dtype="float16",
         seqlen=8192, head_dim=128, batch=2, heads=16, tflops=658.0, kind=MEASURED, date="2026-11-30",
         source="measured by the course's authors on an NVIDIA H200: torch 2.11, N=8192, D=128, B=2, H=16"),
]


# -- measuring this machine ---------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """This machine, measured with numpy: the figures behind its roofline.

    bandwidth: bytes/s of ``np.copyto`` on arrays far larger than the caches
    (read + write counted); flops: dtype name -> FLOP/s of ``np.matmul`` on
    square matrices; exp_per_s: float32 ``np.exp`` results per second.  All
    best-of-repeats, so they are what this machine reaches, not an average.
    """

    bandwidth: float
    flops: dict
    exp_per_s: float
    cpu: str
    threads: int
    date: str
    sram_per_core: int | None = None  # L2 bytes per core, from /sys, when the OS says
    runs: dict | None = None  # figure -> how many timed runs it took for the fastest to agree

    def figure(self, what: str, value: float, unit: str) -> Figure:
        return Figure(value, unit, f"measured with numpy by measure_this_machine() on {self.cpu}: {what}",
                      MEASURED, self.date)

    def as_hardware(self) -> Hardware:
        """This machine as a ``Hardware`` (every figure of kind "measured")."""
        measured = {"bandwidth": self.figure("np.copyto", self.bandwidth, "B/s")}
        measured.update({f"flops:{k}": self.figure(f"np.matmul {k}", v, "FLOP/s") for k, v in self.flops.items()})
        sram = self.sram_per_core or 1 * MiB
        return Hardware(
            key="this_machine", name=f"this machine ({self.cpu})", family="cpu",
            peak_flops={k: measured[f"flops:{k}"] for k in self.flops},
            bandwidth=measured["bandwidth"],
            sram_per_unit=Figure(sram, "B", "L2 per core as /sys reports it" if self.sram_per_core
                                 else "unknown: 1 MiB assumed", MEASURED, self.date),
            units=Figure(self.threads, "cores", "os.sched_getaffinity", MEASURED, self.date), unit_name="core",
            exp_per_s=self.figure("np.exp float32", self.exp_per_s, "exp/s"),
            measured=measured, note="measured by measure_this_machine()")

    def ridge(self, dtype="float32") -> float:
        return self.flops[_dtype_name(dtype)] / self.bandwidth

    def summary(self) -> str:
        flops = ", ".join(f"{k} matmul {v / GIGA:.1f} GFLOP/s" for k, v in self.flops.items())
        text = (f"{self.cpu}, {self.threads} core(s): copy {self.bandwidth / GIGA:.1f} GB/s, {flops}, "
                f"exp {self.exp_per_s / GIGA:.2f} G/s")
        if self.runs:
            unsettled = max(self.runs.values()) >= MAX_RUNS
            text += ("\n  timed runs: " + ", ".join(f"{what} {n}" for what, n in self.runs.items())
                     + (f"; some never settled within {MAX_RUNS} runs (the machine is busy): measure again"
                        if unsettled else f"; each repeated until its 3 fastest agreed within {STABLE_WITHIN:.0%}"))
        return text


STABLE_WITHIN = 0.05  # the three fastest runs agree this closely before a figure is kept
MAX_RUNS = 40


def best_time(fn, repeats: int = 3, *, max_runs: int = MAX_RUNS) -> tuple:
    """(best seconds, runs): repeat until the ``repeats`` fastest runs agree within 5%, or ``max_runs``.

    The one timer behind ``measure_this_machine`` and chapter 02's timing of
    naive attention, so both say how many runs they took and neither keeps
    a figure before it settles.

    On a busy machine one run can be ten times slower than the next (two shared
    cores read 12.9 GFLOP/s once and 200 the run after), so a fixed best-of-3
    can report the noise; the fastest runs agreeing is the sign that the
    figure is the machine's, not its neighbours'.
    """
    fn()  # warm up: page in the buffers, load the BLAS
    times = []
    while len(times) < max(repeats, 1) or (len(times) < max_runs and _spread(times, repeats) > STABLE_WITHIN):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return max(min(times), 1e-9), len(times)


def settled(runs: int, repeats: int = 3, max_runs: int = MAX_RUNS) -> str:
    """How a ``best_time`` figure came about, in words: the runs it took, and whether they agreed."""
    if runs >= max_runs:
        return f"{runs} runs, never settled within {max_runs} (the machine is busy): measure again"
    return f"{runs} runs, until the {repeats} fastest agreed within {STABLE_WITHIN:.0%}"


def _spread(times, k) -> float:
    fastest = sorted(times)[:max(k, 1)]
    return (fastest[-1] - fastest[0]) / max(fastest[0], 1e-12)


def _l2_per_core() -> int | None:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{index}/size") as f:
                size = f.read().strip()
            if level == "2" and size.endswith("K"):
                return int(size[:-1]) * KiB
    except (OSError, ValueError):
        pass
    return None


def measure_this_machine(*, copy_mib: int = 64, matmul_n: int = 512, exp_n: int = 1 << 22,
                         repeats: int = 3) -> Measurement:
    """Measure copy bandwidth, matmul FLOP/s and exp throughput with numpy (about 1-3 s).

    The figures are what numpy reaches here, with the threads the BLAS uses:
    a lower bound on the machine's peak, and the roofline this course's numpy
    kernels actually live under.
    """
    rng = np.random.default_rng(0)
    runs = {}
    src = np.ones(copy_mib * MiB // 8)
    dst = np.empty_like(src)
    seconds, runs["copy"] = best_time(lambda: np.copyto(dst, src), repeats)
    bandwidth = 2 * src.nbytes / seconds
    flops = {}
    for dtype in (np.float32, np.float64):
        a = rng.standard_normal((matmul_n, matmul_n)).astype(dtype)
        b = rng.standard_normal((matmul_n, matmul_n)).astype(dtype)
        out = np.empty_like(a)
        name = np.dtype(dtype).name
        seconds, runs[f"matmul {name}"] = best_time(lambda: np.matmul(a, b, out=out), repeats)
        flops[name] = 2 * matmul_n ** 3 / seconds
    x = rng.standard_normal(exp_n).astype(np.float32)
    y = np.empty_like(x)
    seconds, runs["exp"] = best_time(lambda: np.exp(x, out=y), repeats)
    exp_per_s = exp_n / seconds
    try:
        threads = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        threads = os.cpu_count() or 1
    return Measurement(bandwidth=bandwidth, flops=flops, exp_per_s=exp_per_s, cpu=cpu_model(),
                       threads=threads, date=datetime.date.today().isoformat(), sram_per_core=_l2_per_core(),
                       runs=runs)


# -- drawing ----------------------------------------------------------------------

_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


def draw_roofline(ax, machines, points=(), *, dtype="float16", source="datasheet",
                  intensity_range=(0.1, 1e4), show_ridge=True):
    """Draw roofs of ``machines`` and ``points`` on a matplotlib Axes (log-log).

    machines: Hardware presets or keys (a ``Measurement`` is drawn dashed, as
    measured); points: dicts with ``intensity`` (FLOP/byte), ``flops`` (FLOP/s)
    and ``label`` (optionally ``marker``, ``colour``).  A machine without a peak
    for ``dtype`` is drawn with the peak of ``Hardware.rate_dtype`` and says so in the legend.
    """
    xs = np.logspace(math.log10(intensity_range[0]), math.log10(intensity_range[1]), 256)
    for n, machine in enumerate(machines):
        measured = isinstance(machine, Measurement)
        hw = machine.as_hardware() if measured else hardware(machine)
        used = hw.rate_dtype(dtype)
        src = "measured" if measured else source
        colour = _COLOURS[n % len(_COLOURS)]
        style = "--" if measured or src == "measured" else "-"
        kind = "measured" if measured else hw.peak_flops[used].kind
        label = f"{hw.name} [{used}, {kind}]"
        ax.plot(xs, hw.attainable(xs, used, src), style, color=colour, lw=1.6, label=label)
        if show_ridge:
            ridge = hw.ridge(used, src)
            if intensity_range[0] < ridge < intensity_range[1]:
                ax.plot([ridge], [hw.peak(used, src)], "o", color=colour, ms=4)
    for p in points:
        ax.plot([p["intensity"]], [p["flops"]], p.get("marker", "*"), ms=11,
                color=p.get("colour", "black"), label=p.get("label"), zorder=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, at the level each point counts)")
    ax.set_ylabel("attainable FLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_roofline(machines=("h100_sxm", "a100_80gb", "l4"), points=(), *, dtype="float16",
                  source="datasheet", title=None, figsize=(7.5, 4.5)):
    """A roofline figure of ``machines`` with ``points`` on it (see ``draw_roofline``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    draw_roofline(ax, machines, points, dtype=dtype, source=source)
    ax.set_title(title or f"Roofline ({_dtype_name(dtype)})", fontsize=10)
    fig.tight_layout()
    return fig
