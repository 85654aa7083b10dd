"""What a machine is, as the course's models see it: its figures, each with where it comes from.

``HARDWARE`` holds presets for real and illustrative machines: peak FLOP/s per
dtype, DRAM bandwidth, on-chip SRAM, the number of units (SMs, cores,
clusters), L2, and on GPUs the per-SM limits (shared memory per block and per
SM, the shared memory the runtime reserves per block, the register file and
its allocation unit, the most registers, threads and blocks per SM).  Every
number is a ``Figure``: a value with its unit, its source and its kind, so a
datasheet peak is never mistaken for a measurement:

- ``datasheet``: the vendor's published peak (dense, no sparsity);
- ``paper``: a figure quoted from a paper, cited;
- ``measured``: measured by the course on a named machine on a named date;
- ``illustrative``: a class-typical figure for a kind of device, not a product.

``occupancy(hw, registers, shared, threads)`` is the one model of how many
blocks of a kernel one SM holds at once; the SRAM budget of a tile
(``models.sram``) and the CUDA steps both ask it.  The roofline itself (what
these figures bound) is ``models.roofline``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .rules import dtype_name

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
    max_smem_per_block: Figure | None = None  # shared memory one block may opt in to
    static_smem_per_block: int | None = None  # shared memory a block gets without opting in
    smem_reserved_per_block: int = 0  # bytes the CUDA runtime keeps per block
    registers_per_unit: Figure | None = None  # 32-bit registers per SM
    register_allocation_unit: int | None = None  # registers are handed to a warp in multiples of this
    max_registers_per_thread: int | None = None
    max_threads_per_unit: int | None = None
    max_threads_per_block: int | None = None
    max_blocks_per_unit: int | None = None
    cores_per_unit: Figure | None = None  # cores that share one unit's SRAM (a cluster's cores)
    dma_setup: Figure | None = None  # seconds a DMA transfer costs before its first byte moves
    measured: dict = field(default_factory=dict)  # key -> Figure, kind "measured"
    note: str = ""

    # -- the roofline ---------------------------------------------------------
    def peak(self, dtype="float16", source: str = "datasheet") -> float:
        """Peak FLOP/s for ``dtype``; ``source="measured"`` uses a measured figure when there is one."""
        name = dtype_name(dtype)
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
        name = dtype_name(dtype)
        if name in self.peak_flops:
            return name
        if name.startswith("float8") and "float16" in self.peak_flops:
            return "float16"
        return "float32"

    def figures(self) -> dict:
        """Every figure of this machine by name, datasheet and measured apart."""
        out = {"bandwidth": self.bandwidth, "sram_per_unit": self.sram_per_unit, "units": self.units}
        out.update({f"flops:{k}": v for k, v in self.peak_flops.items()})
        for name in ("memory", "l2", "exp_per_s", "max_smem_per_block", "registers_per_unit", "cores_per_unit",
                     "dma_setup"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update({f"measured {k}": v for k, v in self.measured.items()})
        return out


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
        static_smem_per_block=48 * KiB,  # without the opt-in, on every compute capability
        smem_reserved_per_block=1 * KiB,  # the runtime keeps 1 KiB per block on sm_80 and later
        registers_per_unit=_ds(65536, "registers", f"{tuning}: 64K 32-bit registers per SM"),
        register_allocation_unit=256,  # per warp: the occupancy calculator's allocation unit on sm_50 and later
        max_registers_per_thread=255, max_threads_per_unit=threads, max_threads_per_block=1024,
        max_blocks_per_unit=blocks)


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
        # run 20261207T183811+0000 of benchmarks/gpu_peaks.py (notebooks/records/gpu_peaks.jsonl)
        "bandwidth": Figure(4.11 * TERA, "B/s", f"{_GPU_MD}: device copy of 1 GiB, read + write", MEASURED,
                            "2026-12-07"),
        "flops:float32": Figure(50.7 * TERA, "FLOP/s", f"{_GPU_MD}: cuBLAS fp32 sgemm 8192^3, TF32 off (SIMT)",
                                MEASURED, "2026-12-07"),
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
    dma_setup=_ill(1e-6, "s", "a DMA descriptor's setup and first-beat latency"),
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


# Chapter 15's small parts: a cluster of scalar cores around one DMA-fed SRAM.  They sit apart from
# ``HARDWARE``, the machines chapters 02, 03 and 10 tabulate on one roofline, because their peak is an
# int8 dot-product rate of a few cores, not a matrix unit's; ``hardware(key)`` finds them all the same.
_GAP8_DOC = "Bitcraze AI-deck documentation, 'GAP8' page (after GreenWaves' GAP8 reference manual)"
_GAP8_CHIP = ("WikiChip, greenwaves/gap8: 9 RISC-V cores (8 in the cluster), no FPU; GreenWaves' GAP8 / GAP9 page: "
              "the fabric controller runs at up to 250 MHz, the cluster at up to 175 MHz")
EDGE_PARTS: dict = {}
EDGE_PARTS["gap8"] = Hardware(
    key="gap8", name="GreenWaves GAP8 (8-core RISC-V cluster, 64 kB shared L1)", family="riscv",
    peak_flops={
        # derived: 8 cores x 175 MHz (the cluster's clock) x a 4-way int8 dot product per cycle (PULP's sdotp) x 2
        "int8": _ill(11.2 * GIGA, "OP/s", "8 cores x 175 MHz x 4 int8 MACs per cycle x 2, from the two "
                     "figures above; GreenWaves quotes 'up to 10 GOPS' at a few tens of mW (WikiChip)"),
        "float32": _ill(0.14 * GIGA, "FLOP/s", "no FPU: software floating point, ~20 cycles per FMA on 8 cores"),
        "float16": _ill(0.14 * GIGA, "FLOP/s", "no FPU: software floating point, the float32 rate"),
        "bfloat16": _ill(0.14 * GIGA, "FLOP/s", "no FPU: software floating point, the float32 rate"),
    },
    bandwidth=_ill(200e6, "B/s", "external HyperRAM (L3) over the 8-bit DDR HyperBus, through the micro-DMA"),
    memory=_ds(8 * MiB, "B", "64 Mb of L3 HyperRAM on the AI-deck board; Bitcraze AI-deck documentation"),
    l2=None,  # GAP8's 512 kB L2 is a second scratchpad, not a cache: the DMA fills L1 from it
    sram_per_unit=_ds(64 * KiB, "B", f"cluster L1 64 kB, shared by the 8 cluster cores (L2: 512 kB); {_GAP8_DOC}"),
    units=_ds(1, "cluster", f"one cluster of 8 cores beside the fabric controller; {_GAP8_DOC}"),
    cores_per_unit=_ds(8, "cores", f"8 cluster cores sharing L1; {_GAP8_DOC}; {_GAP8_CHIP}"),
    unit_name="cluster",
    exp_per_s=_ill(8 * 175e6 / 20, "exp/s", "8 cores, ~20 cycles per fixed-point exp"),
    dma_setup=_ill(100 / 175e6, "s", "~100 cycles at the cluster's 175 MHz to program the cluster DMA"),
    note="Public figures (cores, L1, L2, clock) from its documentation; rates and the DMA are illustrative.")


def hardware(key_or_hw) -> Hardware:
    """A preset by key (``"h100_sxm"``, ``"gap8"``) or name, or a ``Hardware`` passed through."""
    if isinstance(key_or_hw, Hardware):
        return key_or_hw
    every = {**HARDWARE, **EDGE_PARTS}
    if key_or_hw in every:
        return every[key_or_hw]
    for hw in every.values():
        if hw.name == key_or_hw:
            return hw
    raise ValueError(f"unknown hardware {key_or_hw!r}; presets: {sorted(every)}")


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
    """The preset table as fixed-width text (deterministic, for notebooks), a column's name over its unit,
    110 columns wide for the presets: the dtype of the peaks is said once, above the machines."""
    width = max(len("machine"), *(len(r["name"]) for r in rows))
    dtypes = ", ".join(sorted({r["dtype"] for r in rows}))
    lines = [f"{'peaks in ' + dtypes:<{width}} {'peak':>7}{'TF32':>8}{'HBM':>7}{'ridge':>7}{'SRAM':>7}{'L2':>6}",
             f"{'machine':<{width}} {'TFLOP/s':>7}{'TFLOP/s':>8}{'TB/s':>7}{'F/B':>7}{'KiB':>7}{'MiB':>6}"
             f"{'units':>6} kind"]
    blank = lambda x, fmt: "-" if x is None else format(x, fmt)
    for r in rows:
        lines.append(f"{r['name']:<{width}} {r['peak_tflops']:>7.4g}{blank(r['tf32_tflops'], '.4g'):>8}"
                     f"{r['bandwidth_tbs']:>7.3g}{r['ridge']:>7.4g}{r['sram_kib']:>7.4g}"
                     f"{blank(r['l2_mib'], '.4g'):>6}{r['units']:>6} {r['kind']}")
    return "\n".join(lines)


PRESETS_BY_DEVICE = {"H200": "h200", "H100": "h100_sxm", "A100": "a100_80gb", "RTX 4090": "rtx_4090", "L4": "l4"}


def preset_for(device) -> str | None:
    """The preset key for a device's name ("NVIDIA H200" -> "h200"), or None (a CPU: no preset is it)."""
    return next((key for name, key in PRESETS_BY_DEVICE.items() if name in str(device or "")), None)


# -- how many blocks one SM holds ------------------------------------------------------

LIMITS = ("shared memory", "registers", "threads", "blocks")  # the order a tie between limits is named in
RECORD_NAMES = {"threads": "warps", "registers": "registers", "shared memory": "shared", "blocks": "blocks"}


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of a kernel one unit (an SM) holds at once, and which limit sets it."""

    blocks: int  # blocks per unit
    warps: int  # warps per unit: blocks x warps per block
    fraction: float  # warps over the most warps a unit holds
    limiter: str  # the limit that allows the fewest blocks (the first of ``LIMITS`` on a tie)
    limits: dict  # limit name -> blocks it alone allows, in the order of ``LIMITS``
    over_block: tuple = ()  # per-block limits the kernel exceeds: "shared memory", "registers"

    def as_record(self) -> dict:
        """This occupancy as the GPU records carry it (and exercise 10.3 asks for it): blocks and warps
        per SM, the fraction, and the limit named "warps", "registers", "shared" or "blocks", a tie going
        to the first of those."""
        limiter = min(RECORD_NAMES, key=lambda name: self.limits[name])
        return {"blocks_per_sm": self.blocks, "warps_per_sm": self.warps, "occupancy": self.fraction,
                "limited_by": RECORD_NAMES[limiter]}


def occupancy(hw, registers: int, shared: int, threads: int) -> Occupancy:
    """Blocks per SM of a kernel with ``registers`` per thread, ``shared`` bytes per block and ``threads``
    per block, from the preset's per-SM limits: a model of the CUDA occupancy calculator, not a measurement.

    Registers go to a warp in multiples of ``register_allocation_unit``; each block also takes the
    shared memory the runtime reserves (a kernel with no shared memory is limited by the block limit
    alone).  A kernel over a per-block limit (shared memory per block, registers per thread) gets no
    block, and ``over_block`` says which.
    """
    hw = hardware(hw)
    if hw.registers_per_unit is None:
        raise ValueError(f"{hw.name} has no register file or SMs: occupancy is a GPU figure")
    warps = -(-int(threads) // 32)
    unit = hw.register_allocation_unit or 32
    per_warp = -(-max(int(registers), 1) * 32 // unit) * unit
    max_warps = hw.max_threads_per_unit // 32
    sram = int(float(hw.sram_per_unit))
    limits = {
        "shared memory": sram // (int(shared) + hw.smem_reserved_per_block) if shared else hw.max_blocks_per_unit,
        "registers": int(float(hw.registers_per_unit)) // (per_warp * warps),
        "threads": max_warps // warps,
        "blocks": hw.max_blocks_per_unit,
    }
    over = []
    if shared > int(float(hw.max_smem_per_block)):
        over.append("shared memory")
    if registers > hw.max_registers_per_thread:
        over.append("registers")
    limits.update({name: 0 for name in over})
    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps, blocks * warps / max_warps, limiter, limits, tuple(over))
