"""Many small cores around one SRAM and one DMA: what they share, they contend for.

A cluster (GAP8's 8 cores and 64 kB L1, the course's ``riscv_manycore``
clusters) has one SRAM and one DMA engine.  Each core runs FlashAttention on
its own query tile of ``Br`` rows, and all of them walk the same key tiles.
Two ways to lay that out:

    private   every core keeps its own K / V buffers: the SRAM holds ``cores`` whole tile
              programs, and the DMA moves every key tile ``cores`` times
    shared    the cluster keeps one set of K / V buffers that every core reads: the SRAM holds
              the K / V buffers once plus each core's Q, softmax state, O accumulator and S,
              and the DMA moves each key tile once

Per key step (double buffered, so the step costs the larger of the two):

    DMA       (copies of the key tile) x (setup + 2 Bc D e / bandwidth)     one engine, in turn
    compute   2 Br Bc D / (MAC rate of one core)                             the cores at once

so ``private`` turns the DMA into the bottleneck as cores are added, and
``shared`` keeps it at one tile's transfer.  ``cluster_step`` returns both
numbers and the SRAM the layout needs; ``DESKTOP_TILE`` is the tile
FlashAttention-2 picks on a desktop GPU, which ``desktop_tile_on`` shows failing
on a cluster's SRAM.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import hardware as presets
from ..models import sram
from .schedule import mac_rate

PRIVATE, SHARED = "private", "shared"
# FlashAttention-2's forward at head dim 128, fp16, no mask, on sm86 / sm89 (RTX 30x0 / 40x0):
# flash-attention, csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128:
# "128 x 32 (48 KB smem) is the fastest for non-causal since we get 2 CTAs per SM"
DESKTOP_TILE = dict(block_q=128, block_k=32, head_dim=128, dtype="float16", hw="rtx_4090",
                    source="flash-attention (Dao-AILab) flash_fwd_launch_template.h, run_mha_fwd_hdim128, sm8x, "
                           "non-causal: Flash_fwd_kernel_traits<128, 128, 32, 4>")


@dataclass(frozen=True)
class ClusterStep:
    """One key step of ``cores`` cores on one cluster: SRAM needed, DMA and compute seconds."""

    layout: str
    cores: int
    sram_bytes: int
    sram_capacity: int
    dma_s: float
    compute_s: float

    @property
    def fits(self) -> bool:
        return self.sram_bytes <= self.sram_capacity

    @property
    def step_s(self) -> float:
        """Seconds per key step, double buffered: the larger of DMA and compute."""
        return max(self.dma_s, self.compute_s)

    @property
    def rows_per_s(self) -> float:
        """(Query tile, key tile) steps the whole cluster finishes per second: its throughput."""
        return self.cores / self.step_s


def int8_tile_parts(block_q: int, block_k: int, head_dim: int, buffers: int = 2) -> tuple:
    """(K / V bytes, the rest) of one int8 tile program: chapter 03's one-level budget in an int8 NPU's dtypes.

    K, V (``buffers`` of each) and Q in int8; m, l, the O accumulator and S in int32; P in uint8;
    O in int8 before its store, which (as in chapter 03) never lives beside S and P.
    """
    kv = 2 * buffers * block_k * head_dim
    rest = block_q * head_dim + 2 * block_q * 4 + block_q * head_dim * 4 + max(block_q * block_k * 5, block_q * head_dim)
    return kv, rest


def cluster_sram(cores: int, block_q: int, block_k: int, head_dim: int, layout: str, buffers: int = 2) -> int:
    """SRAM bytes of ``cores`` int8 tile programs in ``layout``: K / V once (shared) or once per core (private)."""
    kv, rest = int8_tile_parts(block_q, block_k, head_dim, buffers)
    if layout not in (PRIVATE, SHARED):
        raise ValueError(f"layout must be {PRIVATE!r} or {SHARED!r}, got {layout!r}")
    return cores * (kv + rest) if layout == PRIVATE else kv + cores * rest


def cluster_step(cores: int, block_q: int, block_k: int, head_dim: int, hw="gap8", layout: str = SHARED,
                 buffers: int = 2) -> ClusterStep:
    """One int8 key step of ``cores`` cores of ``hw``'s cluster (see the module docstring)."""
    hw = presets.hardware(hw)
    per_cluster = float(hw.cores_per_unit) if hw.cores_per_unit is not None else 1.0
    if not 1 <= cores <= per_cluster:
        raise ValueError(f"{hw.name} has {per_cluster:g} cores per {hw.unit_name}, asked for {cores}")
    setup = float(hw.dma_setup) if hw.dma_setup is not None else 0.0
    one_tile = 2 * (setup + block_k * head_dim / hw.memory_bandwidth())  # K and V, int8
    copies = cores if layout == PRIVATE else 1
    return ClusterStep(layout, cores, cluster_sram(cores, block_q, block_k, head_dim, layout, buffers),
                       int(float(hw.sram_per_unit)), copies * one_tile,
                       2 * block_q * block_k * head_dim / (mac_rate(hw, "int8") / per_cluster))


def desktop_tile_on(hw="gap8") -> dict:
    """The desktop GPU's tile against ``hw``'s SRAM: its one-level bytes, the GPU's shared memory and the cluster's."""
    t = DESKTOP_TILE
    budget = sram.tile_budget(t["block_q"], t["block_k"], t["head_dim"], t["dtype"])
    target, gpu = presets.hardware(hw), presets.hardware(t["hw"])
    return dict(tile=(t["block_q"], t["block_k"], t["head_dim"]), shared_bytes=budget.shared_bytes,
                one_level_bytes=budget.total_bytes, gpu_smem_per_sm=int(float(gpu.sram_per_unit)),
                gpu_fits=sram.fits(budget, gpu), sram_bytes=int(float(target.sram_per_unit)),
                fits=budget.total_bytes <= int(float(target.sram_per_unit)),
                per_core_share=int(float(target.sram_per_unit) / float(target.cores_per_unit or 1)),
                source=t["source"])
