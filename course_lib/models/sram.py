"""The SRAM budget of one FlashAttention tile: what must sit on chip at once.

A program working on query tile ``i`` (``Br`` rows) against key tile ``j``
(``Bc`` keys) keeps, in the input dtype unless said otherwise:

    shared memory   Q tile  Br x D      K tile  Bc x D      V tile  Bc x Dv
                    (K and V times ``kv_stages``: separate pipeline stages, as FA3 and Triton use)
    registers       m, l    Br each, float32        the running max and sum of the softmax
                    O acc   Br x Dv, float32        the output accumulator
                    S / P   Br x Bc, float32        scores, then probabilities (inner loop)
                    P       Br x Bc, input dtype    P converted for the P V matmul (low precision)
                    O out   Br x Dv, input dtype    O converted before the store (epilogue)

S and its converted P live only inside the inner loop; O out only after it.  So
the register peak is ``m + l + O acc + max(S + P, O out)``, and the one-level
total (a CPU core, an NPU scratchpad, a RISC-V cluster: no register file to
spill into) is shared + that peak.  float32 inputs need no conversion buffers;
float64 ones accumulate in float64.

Where each tensor really lives differs between kernels (``PLACEMENT``).  In
FlashAttention-2 (sm80 code) Q is staged through shared memory and each warp
reads its own Br / warps rows into registers as the MMA's operand; K and V sit
in shared memory, one buffer each (the next tile's load is issued while the
current one is used: V_j loads during S = Q K_j^T, K_{j+1} during P V_j);
S / P and the O accumulator are registers, split across warps by rows; O
leaves through shared memory (reusing Q's) for wide stores.  In
FlashAttention-3 (Hopper) Q stays in shared memory, where wgmma reads it as a
tensor-core operand, and K / V stream through a multi-stage TMA pipeline.
The budget below counts the same bytes either way; ``kv_stages`` > 1 is the
FA3 / Triton pipeline, not FA2.

``tile_fit(budget, hw)`` says whether the tile fits a preset and how many
such blocks one SM (or core, or cluster) holds at once, limited by shared
memory, registers, threads or the block limit (on a GPU, ``core.hardware.occupancy``
counts the blocks from the preset's per-SM limits).  The register count is an
estimate (bytes spread over the block's threads, plus ``REGISTER_OVERHEAD``
for indices and pointers): the compiler decides the real one.  It depends on
the warps: 128 x 128 at D = 128 spills with 4 warps (128 threads) and fits
with 8, which is why kernels pair big tiles with 8 warps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core import hardware, rules

SHARED, REGISTERS = "shared", "registers"
ALWAYS, INNER, EPILOGUE = "always", "inner loop", "epilogue"
REGISTER_OVERHEAD = 16  # registers per thread for indices, pointers, loop counters: a rough allowance
# registers are handed out per warp in units of 256 on every GPU the presets hold: per thread, 8
REGISTER_GRANULE = hardware.hardware("h200").register_allocation_unit // 32

@dataclass(frozen=True)
class Item:
    """One buffer of the tile: its shape, dtype, where it lives and when it is live."""

    name: str
    shape: tuple
    dtype: str
    where: str
    live: str = ALWAYS

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * rules.itemsize(self.dtype)


@dataclass(frozen=True)
class TileBudget:
    """The on-chip bytes of one tile program; see the module docstring for what is counted."""

    block_q: int
    block_k: int
    head_dim: int
    head_dim_v: int
    dtype: str
    kv_stages: int
    items: tuple

    def _sum(self, where=None, live=None) -> int:
        return sum(it.bytes for it in self.items
                   if (where is None or it.where == where) and (live is None or it.live == live))

    @property
    def shared_bytes(self) -> int:
        return self._sum(SHARED)

    @property
    def register_bytes(self) -> int:
        """Peak live register bytes: what is always live plus the larger of inner loop and epilogue."""
        return (self._sum(REGISTERS, ALWAYS)
                + max(self._sum(REGISTERS, INNER), self._sum(REGISTERS, EPILOGUE)))

    @property
    def total_bytes(self) -> int:
        """Peak bytes on chip when everything shares one SRAM (CPU core, NPU, RISC-V cluster)."""
        return self.shared_bytes + self.register_bytes

    def registers_per_thread(self, num_warps: int = 4) -> int:
        """Estimated 32-bit registers per thread: register bytes over the block's threads, plus overhead."""
        threads = 32 * num_warps
        raw = math.ceil(self.register_bytes / 4 / threads) + REGISTER_OVERHEAD
        return REGISTER_GRANULE * math.ceil(raw / REGISTER_GRANULE)

    def table(self) -> str:
        """The budget as fixed-width text, one line per buffer."""
        lines = [f"tile Br={self.block_q} Bc={self.block_k} D={self.head_dim} Dv={self.head_dim_v} "
                 f"{self.dtype}, kv_stages={self.kv_stages}"]
        for it in self.items:
            shape = " x ".join(str(n) for n in it.shape)
            lines.append(f"  {it.name:<22}{shape:<16}{it.dtype:<15}{it.where:<10}{it.live:<11}"
                         f"{it.bytes:>9,} B")
        lines += [f"  {'shared memory':<74}{self.shared_bytes:>9,} B",
                  f"  {'registers (peak live)':<74}{self.register_bytes:>9,} B",
                  f"  {'one-level total':<74}{self.total_bytes:>9,} B"]
        return "\n".join(lines)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def tile_budget(block_q: int, block_k: int, head_dim: int, dtype="float16", *, head_dim_v: int | None = None,
                kv_stages: int = 1) -> TileBudget:
    """The SRAM budget of a Br x Bc tile with head dim D (see the module docstring)."""
    br = _positive_int("block_q", block_q)
    bc = _positive_int("block_k", block_k)
    d = _positive_int("head_dim", head_dim)
    dv = d if head_dim_v is None else _positive_int("head_dim_v", head_dim_v)
    stages = _positive_int("kv_stages", kv_stages)
    name = rules.dtype_name(dtype)
    rules.itemsize(dtype)  # validates the dtype
    acc = rules.acc_dtype(name).name
    k_shape = (bc, d) if stages == 1 else (stages, bc, d)
    v_shape = (bc, dv) if stages == 1 else (stages, bc, dv)
    items = [
        Item("Q tile", (br, d), name, SHARED),
        Item("K tile", k_shape, name, SHARED),
        Item("V tile", v_shape, name, SHARED),
        Item("m (row max)", (br,), acc, REGISTERS),
        Item("l (row sum)", (br,), acc, REGISTERS),
        Item("O accumulator", (br, dv), acc, REGISTERS),
        Item("S / P tile", (br, bc), acc, REGISTERS, INNER),
    ]
    if rules.p_round_dtype(name) is not None:  # low precision: the matmuls read their operands in the input dtype
        items += [Item(f"P in {name}", (br, bc), name, REGISTERS, INNER),
                  Item(f"O out in {name}", (br, dv), name, REGISTERS, EPILOGUE)]
    return TileBudget(br, bc, d, dv, name, stages, tuple(items))


# Where the tensors of one tile program live, kernel by kernel (chapter 03, section 6).
PLACEMENT = {
    "fa2": {
        "Q": "shared memory, read into registers by each warp for its own rows (the MMA's A operand)",
        "K": "shared memory, one buffer, read by every warp",
        "V": "shared memory, one buffer, read by every warp",
        "S / P": "registers, each warp its rows; P converted in registers for P V",
        "O": "registers (float32 accumulator), leaving through shared memory for the store",
        "pipelining": "one K and one V buffer: V_j loads during Q K_j^T, K_{j+1} during P V_j (cp.async)",
    },
    "fa3": {
        "Q": "shared memory, read there by wgmma as a tensor-core operand",
        "K": "shared memory, several pipeline stages filled by TMA",
        "V": "shared memory, several pipeline stages filled by TMA",
        "S / P": "registers; P is the register operand of the second wgmma",
        "O": "registers (float32 accumulator), leaving through shared memory (TMA store)",
        "pipelining": "separate K / V stages, producer warps loading while consumer warpgroups compute",
    },
}


# -- does it fit? how many at once? ------------------------------------------------

@dataclass(frozen=True)
class TileFit:
    """Whether a tile fits a machine, and how many tile programs one unit holds at once."""

    hardware: str
    fits: bool
    blocks_per_unit: int
    limiter: str  # what sets blocks_per_unit
    limits: dict  # limit name -> blocks it alone would allow
    registers_per_thread: int | None
    reason: str  # one line a learner can read

    def __bool__(self):
        return self.fits


def tile_fit(budget: TileBudget, hw, num_warps: int = 4) -> TileFit:
    """Fit and blocks per SM (GPU) or per core / cluster / NPU (one-level SRAM)."""
    hw = hardware.hardware(hw)
    sram = int(float(hw.sram_per_unit))
    if hw.registers_per_unit is None:  # one SRAM holds everything
        blocks = sram // budget.total_bytes
        fits = blocks >= 1
        reason = (f"{budget.total_bytes:,} B of {sram:,} B SRAM per {hw.unit_name}"
                  + ("" if fits else ": does not fit"))
        return TileFit(hw.name, fits, blocks, "SRAM", {"SRAM": blocks}, None, reason)
    threads = 32 * _positive_int("num_warps", num_warps)
    regs = budget.registers_per_thread(num_warps)
    occ = hardware.occupancy(hw, regs, budget.shared_bytes, threads)
    problems = []
    if "shared memory" in occ.over_block:
        problems.append(f"shared memory {budget.shared_bytes:,} B > {int(float(hw.max_smem_per_block)):,} B per block")
    if "registers" in occ.over_block:
        problems.append(f"~{regs} registers per thread > {hw.max_registers_per_thread} (would spill)")
    limits, limiter, blocks = occ.limits, occ.limiter, occ.blocks
    fits = blocks >= 1
    if fits:
        reason = (f"{budget.shared_bytes:,} B shared, ~{regs} registers/thread x {threads} threads: "
                  f"{blocks} block(s) per SM, limited by {limiter}")
    else:
        reason = "does not fit: " + "; ".join(problems or [f"{limiter} allows no block"])
    return TileFit(hw.name, fits, blocks, limiter, limits, regs, reason)


def fits(budget: TileBudget, hw, num_warps: int = 4) -> bool:
    """True when one tile program fits the machine at all."""
    return tile_fit(budget, hw, num_warps).fits


def fits_all(budget: TileBudget, num_warps: int = 4) -> dict:
    """``tile_fit`` against every preset in ``hardware.HARDWARE``, by key."""
    return {key: tile_fit(budget, key, num_warps) for key in hardware.HARDWARE}


def largest_square_tile(head_dim: int, dtype, hw, *, num_warps: int = 4, candidates=(16, 32, 64, 128, 256)):
    """The largest Br = Bc from ``candidates`` that fits ``hw``, or None."""
    best = None
    for b in candidates:
        if fits(tile_budget(b, b, head_dim, dtype), hw, num_warps):
            best = b
    return best


# -- drawing ---------------------------------------------------------------------

_ITEM_STYLE = {  # colour and the short label drawn inside a bar
    "Q tile": ("#1f77b4", "Q"), "K tile": ("#ff7f0e", "K"), "V tile": ("#2ca02c", "V"),
    "m (row max)": ("#9467bd", "m"), "l (row sum)": ("#8c564b", "l"), "O accumulator": ("#d62728", "O acc"),
    "S / P tile": ("#e377c2", "S/P"),
}


def _style(name):
    if name.startswith("P in"):
        return "#bcbd22", "P lo"
    if name.startswith("O out"):
        return "#17becf", "O out"
    return _ITEM_STYLE.get(name, ("#7f7f7f", name))


def draw_budget(ax, budget: TileBudget, hw, num_warps: int = 4):
    """Stacked bars of the tile's buffers against the machine's capacity (KiB).

    GPU: a shared-memory bar against the per-block limit and a register bar
    (the buffers live at the register peak) against 255 registers per thread;
    other machines: one bar against the SRAM of a core / NPU / cluster.  A
    capacity mark is red when the bar overruns it.
    """
    hw = hardware.hardware(hw)
    if hw.registers_per_unit is not None:
        threads = 32 * num_warps
        reg_cap = (hw.max_registers_per_thread - REGISTER_OVERHEAD) * 4 * threads
        bars = [("shared memory", [it for it in budget.items if it.where == SHARED],
                 float(hw.max_smem_per_block), "per block"),
                ("registers", _peak_register_items(budget), reg_cap, f"{threads} threads")]
    else:
        items = [it for it in budget.items if it.where == SHARED] + _peak_register_items(budget)
        bars = [(f"SRAM per {hw.unit_name}", items, float(hw.sram_per_unit), "capacity")]
    longest = max(max(sum(it.bytes for it in items), cap) for _, items, cap, _ in bars) / 1024
    for row, (_label, items, cap, cap_label) in enumerate(bars):
        left = 0.0
        for it in items:
            width = it.bytes / 1024
            colour, short = _style(it.name)
            ax.barh(row, width, left=left, color=colour, edgecolor="white", height=0.6)
            if width > 0.06 * longest:
                ax.text(left + width / 2, row, short, ha="center", va="center", fontsize=7, color="white")
            left += width
        over = left > cap / 1024
        ax.plot([cap / 1024] * 2, [row - 0.42, row + 0.42], color="red" if over else "black", lw=2.5)
        ax.text(cap / 1024, row + 0.34, f" {cap_label}: {cap / 1024:.0f} KiB", fontsize=7, va="bottom",
                color="red" if over else "black")
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylim(-0.6, len(bars) - 0.2)
    ax.set_xlim(0, longest * 1.25)
    ax.set_xlabel("KiB")
    return ax


def _peak_register_items(budget: TileBudget) -> list:
    """The register buffers live at the peak: always-live ones and the larger phase."""
    regs = [it for it in budget.items if it.where == REGISTERS]
    inner = sum(it.bytes for it in regs if it.live == INNER)
    epilogue = sum(it.bytes for it in regs if it.live == EPILOGUE)
    phase = INNER if inner >= epilogue else EPILOGUE
    return [it for it in regs if it.live in (ALWAYS, phase)]


def plot_budget(budget: TileBudget, hw="h100_sxm", num_warps: int = 4, figsize=(7, 2.6)):
    """Figure: the tile's SRAM budget against one machine (static, for nbviewer)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    draw_budget(ax, budget, hw, num_warps)
    occ = tile_fit(budget, hw, num_warps)
    ax.set_title(f"{hardware.hardware(hw).name}: {occ.reason}", fontsize=8)
    fig.tight_layout()
    return fig
