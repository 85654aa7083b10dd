"""The schedule of a scratchpad accelerator: DMA engines fill buffers, compute units drain them.

A kernel on an NPU streams tiles: a DMA engine copies tile ``j`` from DRAM into
one of ``buffers`` scratchpad buffers, a compute unit works on it, and the
buffer is free again when that work ends.  Two rules decide every time:

    the load of tile j    starts when its DMA engine is free and its buffer is free:
                          the compute of tile j - buffers has ended
    the compute of tile j starts when tile j is loaded and its compute unit is free

(tile ``j`` goes to buffer ``j % buffers``, DMA engine ``j % dma_engines`` and
compute unit ``j % compute_units``).  ``simulate`` applies them tile by tile and
returns the whole timeline.  With one engine, one unit and the same times for
every tile it has a closed form (``predicted_time``):

    1 buffer      load and compute take turns:        n (load + compute)
    2 or more     the steady state hides the shorter: load + compute + (n - 1) max(load, compute)

so double buffering turns a sum into a max, and a third buffer buys nothing
while every tile takes the same time; it pays only when the times vary (a
tile that loads slowly borrows the slack of its neighbours).  The prologue
(the Q tile loaded before the first key tile) and the epilogue (O stored
after the last) are paid in full.

``attention_plan`` is FlashAttention-2's forward for one head as this
schedule: per query tile, a Q load, ``Tc`` key tiles (K and V: one DMA
transfer each, every transfer paying the DMA's setup time) computed at the
MAC rate, and an O store; the SRAM it needs is chapter 03's one-level budget
with ``kv_stages = buffers``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core import hardware as presets
from ..core import rules
from ..models import sram

LOAD, COMPUTE, STORE = "load", "compute", "store"


@dataclass(frozen=True)
class Step:
    """One bar of the timeline: what ran on which engine or unit, when, and in which buffer."""

    lane: str  # "DMA 0", "compute 0", ...
    kind: str  # LOAD, COMPUTE, STORE
    tile: int  # -1 for the prologue and the epilogue
    buffer: int  # -1 where no key buffer is used
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A whole schedule: its steps and when the last one ends."""

    buffers: int
    steps: tuple

    @property
    def total(self) -> float:
        return max((s.end for s in self.steps), default=0.0)

    def lanes(self) -> list:
        return sorted({s.lane for s in self.steps}, key=lambda lane: (not lane.startswith("DMA"), lane))

    def busy(self, lane: str) -> float:
        """Seconds ``lane`` worked."""
        return sum(s.end - s.start for s in self.steps if s.lane == lane)

    def compute_ends(self) -> np.ndarray:
        """When each tile's compute ended, by tile."""
        ends = {s.tile: s.end for s in self.steps if s.kind == COMPUTE}
        return np.array([ends[j] for j in range(len(ends))])


def _per_tile(x, n):
    x = np.broadcast_to(np.asarray(x, float), (n,))
    if np.any(x < 0) or not np.all(np.isfinite(x)):
        raise ValueError("load and compute times must be finite and >= 0")
    return x


def _count(name, value, least=1):
    if isinstance(value, bool) or int(value) != value or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def simulate(load_s, compute_s, buffers: int, *, n_tiles: int | None = None, dma_engines: int = 1,
             compute_units: int = 1, prologue_s: float = 0.0, epilogue_s: float = 0.0) -> Timeline:
    """The timeline of ``n_tiles`` tiles under the two rules of the module docstring.

    ``load_s`` and ``compute_s`` are seconds per tile: one number for every tile, or one per tile.
    The prologue is a load on DMA 0 that every compute waits for; the epilogue a store on DMA 0
    after the last compute.
    """
    buffers = _count("buffers", buffers)
    engines, units = _count("dma_engines", dma_engines), _count("compute_units", compute_units)
    n = n_tiles if n_tiles is not None else max(np.size(load_s), np.size(compute_s))
    n = _count("n_tiles", n, least=0)
    load, comp = _per_tile(load_s, n), _per_tile(compute_s, n)
    steps = []
    engine_free, unit_free = np.zeros(engines), np.zeros(units)
    if prologue_s:
        steps.append(Step("DMA 0", LOAD, -1, -1, 0.0, float(prologue_s)))
        engine_free[0] = float(prologue_s)
    ready = float(prologue_s)
    load_end, comp_end = np.zeros(n), np.zeros(n)
    for j in range(n):
        e, u = j % engines, j % units
        start = max(engine_free[e], comp_end[j - buffers] if j >= buffers else 0.0)
        load_end[j] = engine_free[e] = start + load[j]
        steps.append(Step(f"DMA {e}", LOAD, j, j % buffers, start, load_end[j]))
        begin = max(load_end[j], unit_free[u], ready)
        comp_end[j] = unit_free[u] = begin + comp[j]
        steps.append(Step(f"compute {u}", COMPUTE, j, j % buffers, begin, comp_end[j]))
    if epilogue_s:
        start = max(engine_free[0], comp_end.max(initial=ready))
        steps.append(Step("DMA 0", STORE, -1, -1, start, start + float(epilogue_s)))
    return Timeline(buffers, tuple(steps))


def steady_state(load_s: float, compute_s: float, buffers: int) -> float:
    """Seconds per tile once the pipeline is full: the sum with one buffer, the max with two or more."""
    buffers = _count("buffers", buffers)
    return load_s + compute_s if buffers == 1 else max(load_s, compute_s)


def predicted_time(n_tiles: int, load_s: float, compute_s: float, buffers: int, *,
                   prologue_s: float = 0.0, epilogue_s: float = 0.0) -> float:
    """The closed form of ``simulate`` for one engine, one unit and equal tiles."""
    n = _count("n_tiles", n_tiles, least=0)
    if n == 0:
        return prologue_s + epilogue_s
    body = n * (load_s + compute_s) if _count("buffers", buffers) == 1 else (
        load_s + compute_s + (n - 1) * max(load_s, compute_s))
    return prologue_s + body + epilogue_s


# -- FlashAttention-2's forward on an NPU --------------------------------------------------

@dataclass(frozen=True)
class AttentionPlan:
    """One head of FA2's forward as a DMA / compute schedule on a scratchpad NPU."""

    block_q: int
    block_k: int
    buffers: int
    sram_bytes: int  # the one-level budget with kv_stages = buffers
    fits: bool
    kv_load_s: float  # one key tile: K and V, two transfers
    tile_compute_s: float  # one Br x Bc tile: 2 Br Bc D MACs
    q_load_s: float
    o_store_s: float
    query_tiles: int
    key_tiles: int

    @property
    def per_query_tile_s(self) -> float:
        return predicted_time(self.key_tiles, self.kv_load_s, self.tile_compute_s, self.buffers,
                              prologue_s=self.q_load_s, epilogue_s=self.o_store_s)

    @property
    def total_s(self) -> float:
        return self.query_tiles * self.per_query_tile_s

    @property
    def steady_s(self) -> float:
        return steady_state(self.kv_load_s, self.tile_compute_s, self.buffers)

    @property
    def bound(self) -> str:
        return "DMA" if self.kv_load_s > self.tile_compute_s else "compute"


def mac_rate(hw, dtype) -> float:
    """Multiply-adds per second of ``hw`` at ``dtype``: its peak OP/s over two."""
    hw = presets.hardware(hw)
    name = rules.dtype_name(dtype)
    return hw.peak("int8" if name == "int8" else hw.rate_dtype(name)) / 2


def attention_plan(seqlen: int, head_dim: int, block_q: int, block_k: int, buffers: int, hw="edge_npu",
                   dtype="float16") -> AttentionPlan:
    """FA2's forward, Nq = Nk = ``seqlen``, on ``hw``'s scratchpad and DMA (see the module docstring)."""
    hw = presets.hardware(hw)
    return plan_for(seqlen, head_dim, block_q, block_k, buffers, sram_bytes=int(float(hw.sram_per_unit)),
                    bandwidth=hw.memory_bandwidth(), dma_setup=float(hw.dma_setup) if hw.dma_setup is not None else 0.0,
                    macs_per_s=mac_rate(hw, dtype), dtype=dtype)


def plan_for(seqlen: int, head_dim: int, block_q: int, block_k: int, buffers: int, *, sram_bytes: int,
             bandwidth: float, dma_setup: float, macs_per_s: float, dtype="float16") -> AttentionPlan:
    """``attention_plan`` for a machine given by its four numbers: scratchpad bytes, DRAM B/s, seconds of
    setup per DMA transfer and multiply-adds per second."""
    e = rules.itemsize(dtype)
    transfer = lambda nbytes: dma_setup + nbytes / bandwidth
    budget = sram.tile_budget(block_q, block_k, head_dim, dtype, kv_stages=buffers)
    o_bytes = block_q * head_dim * e + block_q * 4  # O in the input dtype and lse in float32
    return AttentionPlan(
        block_q, block_k, buffers, budget.total_bytes, budget.total_bytes <= sram_bytes,
        kv_load_s=2 * transfer(block_k * head_dim * e),
        tile_compute_s=2 * block_q * block_k * head_dim / macs_per_s,
        q_load_s=transfer(block_q * head_dim * e), o_store_s=transfer(o_bytes),
        query_tiles=math.ceil(seqlen / block_q), key_tiles=math.ceil(seqlen / block_k))


def best_plan(seqlen: int, head_dim: int, hw="edge_npu", dtype="float16", tiles=(16, 32, 64, 128, 256),
              buffer_counts=(1, 2, 3), **machine) -> AttentionPlan:
    """The plan that fits and finishes first (ties: the smaller SRAM footprint).  ``machine``: the four
    numbers of ``plan_for`` instead of a preset."""
    plan = (lambda br, bc, b: plan_for(seqlen, head_dim, br, bc, b, dtype=dtype, **machine)) if machine else (
        lambda br, bc, b: attention_plan(seqlen, head_dim, br, bc, b, hw, dtype))
    fitting = [p for p in (plan(br, bc, b) for br in tiles for bc in tiles for b in buffer_counts) if p.fits]
    if not fitting:
        raise ValueError("no tile fits this machine's scratchpad")
    return min(fitting, key=lambda p: (p.total_s, p.sram_bytes))
