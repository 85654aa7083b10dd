"""The course's interactive explorers, each with a static twin.

Every explorer is an ``ipywidgets`` box (``Explorer``) holding its controls,
a text summary and the figure as a PNG image.  Moving a control recomputes
the numbers (kept in ``explorer.result``) and redraws.  The static twin is a
plain function that draws the same figure with matplotlib, so a notebook reads
the same in nbviewer and executes under nbval, where no widget ever renders.

    explorer = tile_size_explorer()        # in JupyterLab
    explorer.controls["block_q"].value = 128
    explorer.result.budget.total_bytes     # what it now shows
    fig = tile_size_figure(block_q=128)    # the same figure, static

Sections, one per chapter; later chapters add theirs at the end:
  the Explorer box          (shared)
  tile_size_explorer        (chapter 03: tiling and the SRAM budget)
  roofline_explorer         (chapter 02: the roofline)
"""
from __future__ import annotations

import base64
import contextlib
import functools
import html
import math
from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from .. import checks
from ..core import hardware as presets
from ..core import rules
from ..kernels import counted
from ..models import iomodel, measure, roofline, sram
from . import figstyle, roofline_plot

POWERS_OF_TWO_TILES = (16, 32, 64, 128, 256)
HEAD_DIMS = (32, 64, 128, 256)
DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")
SEQLENS = tuple(2 ** p for p in range(8, 18))  # 256 .. 131072


def _hardware_options():
    return [(hw.name, key) for key, hw in presets.HARDWARE.items()]


# -- the Explorer box -----------------------------------------------------------------

def _import_widgets():
    try:
        import ipywidgets
    except ImportError as err:  # pragma: no cover - ipywidgets is a course dependency
        raise ImportError("the explorers need ipywidgets 8: pip install 'ipywidgets>=8'") from err
    return ipywidgets


PNG_DPI = figstyle.PNG_DPI  # the figure is drawn at 1.6x the pixels it is shown at: sharp on a high-DPI screen
SHOWN_DPI = figstyle.SHOWN_DPI  # CSS pixels per inch of figsize in the notebook


def _png(draw, result, figsize) -> bytes:
    """Draw on a figure that pyplot does not track (no stray inline copies), in the course's style; PNG bytes."""
    from matplotlib.figure import Figure

    with figstyle.context():
        fig = Figure(figsize=figsize)
        draw(fig, result)
        return figstyle.png_bytes(fig)


def figure_image(widgets, figsize):
    """An Image widget that shows a PNG drawn at PNG_DPI at figsize's size (never wider than the page)."""
    image = widgets.Image(format="png")
    image.layout.width = f"{figsize[0] * SHOWN_DPI:.0f}px"
    image.layout.max_width = "100%"
    image.add_class("explorer-figure")
    return image


@functools.lru_cache(maxsize=1)
def figure_box_class():
    """``FigureBox``: an ipywidgets VBox whose output carries its figure as a PNG too.

    A notebook stores a widget's output as a reference to a live model that a
    reader of the file never has: nbviewer and GitHub show its text
    (``Explorer(children=(HBox(...``) and JupyterLab, before the cell is run,
    "model not found".  A FigureBox adds ``image/png`` (the figure it shows,
    from its ``image`` widget) and a one-line ``text/plain``, so the stored
    output is the static figure; run the cell and the live widget replaces it.
    """
    widgets = _import_widgets()

    class FigureBox(widgets.VBox):
        description = "an interactive figure"

        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs) or {}
            png = getattr(getattr(self, "image", None), "value", b"")
            metadata = {}
            if png:
                data["image/png"] = base64.b64encode(png).decode("ascii")
                width, height = figstyle.png_size(png)   # shown at its figsize, as the lecture's figures
                metadata["image/png"] = {"width": round(width * SHOWN_DPI / PNG_DPI),
                                         "height": round(height * SHOWN_DPI / PNG_DPI)}
            data["text/plain"] = (f"<{self.description}: run this cell in JupyterLab to move its controls;\n"
                                  " the image is the figure for the values it was run with>")   # two lines: 110 columns
            return (data, metadata) if metadata else data

    return FigureBox


def _explorer_class():
    widgets = _import_widgets()

    class Explorer(figure_box_class()):
        """Controls, a summary (``summary.value`` is HTML) and the figure (``image.value`` is PNG bytes).

        ``controls``: name -> widget, set ``.value`` to drive it; ``result``: the
        numbers behind what is shown now; ``error``: the message when the last
        update failed (also shown in the summary), else None.
        """

        def __init__(self, name, controls, compute, draw, figsize):
            self.controls = controls
            self._compute, self._draw, self._figsize = compute, draw, figsize
            self.result, self.error = None, None
            self._holding = False
            self.summary = widgets.HTML()
            self.summary.add_class("explorer-summary")
            self.image = figure_image(widgets, figsize)
            self.description = name.replace("-", " ")
            for key, control in controls.items():
                control.add_class(f"control-{key}")
                control.observe(self.update, names="value")
            rows = [widgets.HBox(list(controls.values())[i:i + 3]) for i in range(0, len(controls), 3)]
            super().__init__(rows + [self.summary, self.image])
            self.add_class(name)
            self.update()

        def values(self) -> dict:
            return {key: control.value for key, control in self.controls.items()}

        @contextlib.contextmanager
        def batch(self):
            """Set several controls at once and recompute once, on leaving the block."""
            self._holding = True
            try:
                yield self
            finally:
                self._holding = False
                self.update()

        def update(self, change=None):
            """Recompute from the controls and redraw (a control's observer)."""
            if self._holding:
                return
            try:
                result = self._compute(**self.values())
            except (ValueError, MemoryError) as err:  # a learner's choice the models reject
                self.error = str(err)
                self.summary.value = f"<pre style='color:#b00'>{html.escape(self.error)}</pre>"
                return
            png = _png(self._draw, result, self._figsize)
            self.result, self.error = result, None
            self.image.value = png  # the figure first, so that a changed summary means both are new
            self.summary.value = f"<pre style='line-height:1.25'>{html.escape(result.summary())}</pre>"

    return Explorer


def _selection_slider(widgets, label, options, value):
    return widgets.SelectionSlider(description=label, options=list(options), value=value,
                                   continuous_update=False, style={"description_width": "initial"})


def _dropdown(widgets, label, options, value):
    return widgets.Dropdown(description=label, options=options, value=value,
                            style={"description_width": "initial"})


# -- chapter 03: the tile-size explorer ---------------------------------------------------

def _versus_naive(naive_bytes, flash_bytes) -> str:
    """'3.2x fewer bytes' or '1.9x more bytes': never '0.5x less' for twice as much."""
    if flash_bytes <= naive_bytes:
        return f"{naive_bytes / flash_bytes:.1f}x fewer bytes"
    return f"{flash_bytes / naive_bytes:.1f}x more bytes: at this N and tile, FA2's re-reads of K and V cost more than S"


@dataclass(frozen=True)
class TileSizeResult:
    """Everything the tile-size explorer shows for one setting of its controls."""

    block_q: int
    block_k: int
    head_dim: int
    dtype: str
    hardware: str  # preset key
    seqlen: int
    budget: sram.TileBudget
    occupancy: sram.TileFit
    naive: iomodel.Traffic  # at seqlen, fused softmax: two-level count (chip <-> L2 + HBM)
    flash: iomodel.Traffic  # FA2 loop order at seqlen, two-level count
    naive_bound: roofline.Bound  # two-level estimates: every byte charged to HBM
    flash_bound: roofline.Bound
    flash_levels: iomodel.Levels | None  # the L2-aware view of FA2 (None on a machine without an L2 figure)
    run_dtype: str  # the dtype the small run used
    run_shape: tuple  # (Nq, Nk) of the small run
    error: np.ndarray  # |tiled kernel - reference|, (Nq, D) of the small run
    max_error: float
    within_tolerance: bool

    def summary(self) -> str:
        hw = presets.hardware(self.hardware)
        b, o = self.budget, self.occupancy
        lines = [
            f"tile Br={self.block_q} Bc={self.block_k}, D={self.head_dim}, {self.dtype} on {hw.name}",
            f"SRAM budget: {b.shared_bytes:,} B shared + {b.register_bytes:,} B registers "
            f"= {b.total_bytes:,} B on chip",
            f"fits: {'yes' if o.fits else 'NO'}; {o.reason}",
            f"traffic between chip and L2 + HBM at N={self.seqlen} (two-level count): naive "
            f"{self.naive.bytes / 2**20:,.1f} MiB, FlashAttention-2 {self.flash.bytes / 2**20:,.1f} MiB "
            f"({_versus_naive(self.naive.bytes, self.flash.bytes)})",
            f"intensity: naive {self.naive.intensity:.1f}, flash {self.flash.intensity:.1f} FLOP/B "
            f"(ridge {hw.ridge(self._peak_dtype(hw)):.0f})",
            f"two-level estimate (all of it through HBM): naive {self.naive_bound.seconds * 1e3:.4g} ms "
            f"({self.naive_bound.limiter}), flash {self.flash_bound.seconds * 1e3:.4g} ms ({self.flash_bound.limiter})",
            f"small run ({self.run_dtype}, Nq={self.run_shape[0]}, Nk={self.run_shape[1]}, tails included): "
            f"max |error| {self.max_error:.2e}, "
            f"{'within' if self.within_tolerance else 'OUTSIDE'} the course tolerance",
        ]
        if self.flash_levels is not None:
            lv = self.flash_levels
            lines.insert(4, f"HBM for FA2: {lv.hbm_bytes / 2**20:,.1f} MiB ({lv.reason()})")
        return "\n".join(lines)

    def _peak_dtype(self, hw):
        return hw.rate_dtype(self.dtype)


@functools.lru_cache(maxsize=64)
def _small_run(block_q, block_k, head_dim, dtype):
    """Run the counted FA2 kernel on a small problem with tails; return (Nq, Nk), error map, max, verdict."""
    from .. import api

    nq, nk = 2 * block_q + 5, 2 * block_k + 3  # two full tiles and a tail, in both directions
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, head_dim)).astype(dtype) for n in (nq, nk, nk))
    run = counted.run_counted(q, k, v, schedule="fa2", block_q=block_q, block_k=block_k)
    expected = api.attention(q, k, v, impl="reference").astype(np.float64)
    bound, atol, rtol, rule = checks.attention_tolerance(q, k, v, expected)
    verdict = checks.compare("tiled", run.out, expected, bound=bound, atol=atol, rtol=rtol, rule=rule)
    error = np.abs(run.out.astype(np.float64) - expected)[0, 0]
    return (nq, nk), error, float(error.max()), verdict.passed


def tile_size_numbers(block_q=64, block_k=64, head_dim=64, dtype="float16", hardware="h100_sxm",
                      seqlen=4096) -> TileSizeResult:
    """The numbers behind the tile-size explorer (and its static twin)."""
    hw = presets.hardware(hardware)
    dtype = rules.dtype_name(dtype)
    budget = sram.tile_budget(block_q, block_k, head_dim, dtype)
    naive = iomodel.naive_io(seqlen, seqlen, head_dim, dtype)
    flash = iomodel.flash_io(seqlen, seqlen, head_dim, dtype, block_q=block_q, block_k=block_k)
    # float8 is not an input dtype of course_lib.attention: the small run uses bfloat16 then
    run_dtype = dtype if dtype in ("float32", "float16", "bfloat16", "float64") else "bfloat16"
    shape, error, max_error, ok = _small_run(block_q, block_k, head_dim, np.dtype(run_dtype))
    lv = (iomodel.levels(seqlen, seqlen, head_dim, dtype, hw, block_q=block_q, block_k=block_k)
          if hw.l2 is not None else None)
    return TileSizeResult(
        block_q, block_k, head_dim, dtype, hw.key, seqlen, budget, sram.tile_fit(budget, hw),
        naive, flash, roofline.time_bound(naive, hw, dtype), roofline.time_bound(flash, hw, dtype), lv,
        run_dtype, shape, error, max_error, ok)


def _draw_tile_size(fig, r: TileSizeResult):
    # the budget across the top, traffic and the error map below: readable in a 1000-pixel column
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.35])
    ax_budget, ax_io, ax_err = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    sram.draw_budget(ax_budget, r.budget, r.hardware)
    ax_budget.set_title(f"SRAM budget: {'fits' if r.occupancy.fits else 'does NOT fit'}"
                        f" ({r.occupancy.blocks_per_unit} per {presets.hardware(r.hardware).unit_name})",
                        fontsize=10, color="black" if r.occupancy.fits else "red")
    names = ["naive", "flash (FA2)"]
    traffic = [r.naive.bytes / 2**20, r.flash.bytes / 2**20]
    notes = [f">= {b.seconds * 1e3:.3g} ms" for b in (r.naive_bound, r.flash_bound)]
    colours = ["#d62728", "#1f77b4"]
    if r.flash_levels is not None:  # what of FA2's traffic reaches HBM while the heads' K and V stay in L2
        names.append("FA2 at HBM")
        traffic.append(r.flash_levels.hbm_bytes / 2**20)
        notes.append("K, V in L2" if r.flash_levels.kv_fits_l2 else "K, V spill L2")
        colours.append("#2ca02c")
    bars = ax_io.bar(names, traffic, color=colours)
    for bar, t, note in zip(bars, traffic, notes):
        ax_io.text(bar.get_x() + bar.get_width() / 2, t, f"{t:,.0f} MiB\n{note}", ha="center", va="bottom",
                   fontsize=9)
    ax_io.set_ylim(0, max(traffic) * 1.3)
    ax_io.set_ylabel("MiB moved")
    ax_io.set_title(f"N = {r.seqlen}: two-level count, and HBM", fontsize=10)
    image = ax_err.imshow(r.error, aspect="auto", cmap="viridis", interpolation="nearest")
    for row in range(r.block_q, r.run_shape[0], r.block_q):  # query tile edges
        ax_err.axhline(row - 0.5, color="white", lw=0.8, ls="--")
    fig.colorbar(image, ax=ax_err, fraction=0.08)
    ax_err.set_title(f"|tiled - reference|, max {r.max_error:.1e} ({r.run_dtype})", fontsize=10)
    ax_err.set_xlabel("head dim")
    ax_err.set_ylabel("query row (dashed: tile edges)")
    fig.tight_layout()


def tile_size_figure(block_q=64, block_k=64, head_dim=64, dtype="float16", hardware="h100_sxm", seqlen=4096):
    """Static twin of ``tile_size_explorer``: the same three panels for one setting."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=TILE_SIZE_FIGSIZE)
    _draw_tile_size(fig, tile_size_numbers(block_q, block_k, head_dim, dtype, hardware, seqlen))
    return fig


TILE_SIZE_FIGSIZE = (9.5, 6.8)


def tile_size_explorer(block_q=64, block_k=64, head_dim=64, dtype="float16", hardware="h100_sxm", seqlen=4096):
    """Br, Bc, D, dtype, hardware, N -> SRAM budget bars, traffic by level, intensity, time estimate,
    and the tiled kernel's elementwise error on a small problem with those tiles."""
    widgets = _import_widgets()
    controls = {
        "block_q": _selection_slider(widgets, "Br (query rows)", POWERS_OF_TWO_TILES, block_q),
        "block_k": _selection_slider(widgets, "Bc (keys)", POWERS_OF_TWO_TILES, block_k),
        "head_dim": _dropdown(widgets, "D", list(HEAD_DIMS), head_dim),
        "dtype": _dropdown(widgets, "dtype", list(DTYPES), rules.dtype_name(dtype)),
        "hardware": _dropdown(widgets, "hardware", _hardware_options(), presets.hardware(hardware).key),
        "seqlen": _selection_slider(widgets, "N", SEQLENS, seqlen),
    }
    return _explorer_class()("tile-size-explorer", controls, tile_size_numbers, _draw_tile_size,
                             TILE_SIZE_FIGSIZE)


# -- chapter 02: the roofline explorer --------------------------------------------------

@functools.lru_cache(maxsize=1)
def this_machine() -> measure.Measurement:
    """``measure.measure_this_machine()``, measured once per session."""
    return measure.measure_this_machine()


@dataclass(frozen=True)
class RooflineResult:
    """What the roofline explorer shows: each schedule's intensity and bound, on a preset and here."""

    hardware: str
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool
    show: str  # "naive", "flash" or "both"
    traffic: dict  # schedule -> Traffic (two-level count)
    bounds: dict  # schedule -> two-level estimate on the preset (datasheet figures, every byte through HBM)
    here: dict  # schedule -> the same on this machine (measured figures)
    measurement: measure.Measurement
    flash_levels: iomodel.Levels | None = None  # FA2 with L2: None on a preset without an L2 figure
    flash_hbm_bound: roofline.Bound | None = None  # FA2's true bound on the preset (compulsory HBM bytes)

    def schedules(self):
        return ["naive", "fa2"] if self.show == "both" else (["naive"] if self.show == "naive" else ["fa2"])

    def summary(self) -> str:
        hw = presets.hardware(self.hardware)
        peak_dtype = hw.rate_dtype(self.dtype)
        lines = [f"{hw.name}, N={self.seqlen}, D={self.head_dim}, {self.dtype}"
                 f"{', causal' if self.causal else ''}: ridge {hw.ridge(peak_dtype):.1f} FLOP/B "
                 f"({peak_dtype}, {hw.peak_flops[peak_dtype].kind})"]
        for s in self.schedules():
            t, b, h = self.traffic[s], self.bounds[s], self.here[s]
            name = "naive" if s == "naive" else "flash (FA2)"
            lines.append(f"{name:<12} intensity {t.intensity:7.1f} FLOP/B (two-level); {hw.key}: "
                         f"~{b.seconds * 1e3:.4g} ms, {b.flops_per_s / 1e12:.4g} TFLOP/s ({b.limiter}); "
                         f"this machine: ~{h.seconds * 1e3:.4g} ms ({h.limiter})")
        if self.flash_levels is not None and "fa2" in self.schedules():
            lv, bound = self.flash_levels, self.flash_hbm_bound
            lines.append(f"flash, L2-aware: {lv.reason()}; true bound {bound.seconds * 1e3:.4g} ms, "
                         f"{bound.flops_per_s / 1e12:.4g} TFLOP/s ({bound.limiter}-bound)")
        return "\n".join(lines)


def roofline_numbers(hardware="h100_sxm", seqlen=4096, head_dim=64, dtype="float16", causal=False, show="both",
                     measurement: measure.Measurement | None = None) -> RooflineResult:
    """The numbers behind the roofline explorer (and its static twin)."""
    if show not in ("naive", "flash", "both"):
        raise ValueError(f"show must be 'naive', 'flash' or 'both', got {show!r}")
    hw = presets.hardware(hardware)
    dtype = rules.dtype_name(dtype)
    measurement = measurement or this_machine()
    traffic = {"naive": iomodel.naive_io(seqlen, seqlen, head_dim, dtype, causal=causal),
               "fa2": iomodel.flash_io(seqlen, seqlen, head_dim, dtype, causal=causal, block_q=128, block_k=64)}
    bounds = {s: roofline.time_bound(t, hw, dtype) for s, t in traffic.items()}
    here = {s: roofline.time_bound(t, measurement, "float32") for s, t in traffic.items()}
    lv = hbm = None
    if hw.l2 is not None:
        lv = iomodel.levels(seqlen, seqlen, head_dim, dtype, hw, causal=causal, block_q=128, block_k=64)
        hbm = roofline.attention_bounds(lv, hw, dtype)["bound"]
    return RooflineResult(hw.key, seqlen, head_dim, dtype, bool(causal), show, traffic, bounds, here, measurement,
                          lv, hbm)


def _room_above(level, levels):
    """How many times ``level`` fits before the next of ``levels`` above it (a line within 5% is its own)."""
    return min((other / level for other in levels if other > 1.05 * level), default=math.inf)


def _room_below(level, levels):
    return min((level / other for other in levels if other < level / 1.05), default=math.inf)


def _draw_roofline(fig, r: RooflineResult):
    ax = fig.subplots()
    hw = presets.hardware(r.hardware)
    points = []
    markers = {"naive": ("o", "#d62728", "naive"), "fa2": ("*", "#1f77b4", "flash (FA2)")}
    for s in r.schedules():
        marker, colour, name = markers[s]
        t = r.traffic[s]
        points.append(dict(intensity=t.intensity, flops=r.bounds[s].flops_per_s, marker=marker, colour=colour,
                           label=f"{name} on {hw.key}"))
        points.append(dict(intensity=t.intensity, flops=r.here[s].flops_per_s, marker=marker, colour="#555555",
                           label=f"{name} on this machine (its float32 roof, {r.dtype} bytes)"))
        if s == "fa2" and r.flash_levels is not None:
            points.append(dict(intensity=r.flash_levels.flops / r.flash_levels.compulsory_bytes,
                               flops=r.flash_hbm_bound.flops_per_s, marker="P", colour="#2ca02c",
                               label=f"{name}, compulsory HBM bytes (K/V in L2): the true bound"))
    roofline_plot.draw_roofline(ax, [hw, r.measurement], points, dtype=r.dtype, intensity_range=(0.5, 3e3))
    exp_roof = r.measurement.exp_per_s * r.traffic["fa2"].flops / r.traffic["fa2"].exps
    ax.axhline(exp_roof, color="#555555", ls=":", lw=1.2, label="this machine's exp roof: numpy exp/s x FLOP per exp")
    # Both exp roofs are labelled at the left end of their lines, where the memory slope keeps every
    # point far below them (at the right end, points sit on the compute roof, often at the same height).
    # Each label goes on the side of its line with more room before the next level line: the other
    # exp roof or a compute roof (this machine's measured roof may sit just above its exp roof).
    labels = [(exp_roof, "this machine's exp roof", "#555555")]  # short: clear of this machine's slope
    levels = [exp_roof, r.measurement.as_hardware().peak("float32"), hw.peak(hw.rate_dtype(r.dtype))]
    if hw.exp_per_s is not None:
        hw_exp = float(hw.exp_per_s) * r.traffic["fa2"].flops / r.traffic["fa2"].exps
        ax.axhline(hw_exp, color="#1f77b4", ls=":", lw=1.2)
        labels.append((hw_exp, f"{hw.name} exp roof ({hw.exp_per_s.kind})", "#1f77b4"))
        levels.append(hw_exp)
    for roof, text, colour in labels:
        below = _room_below(roof, levels) > _room_above(roof, levels) and _room_above(roof, levels) < 4
        ax.text(0.6, roof * (0.8 if below else 1.15), text, fontsize=9, color=colour,
                va="top" if below else "bottom")
    ax.set_title(f"Attention on the roofline: N={r.seqlen}, D={r.head_dim}, {r.dtype}"
                 f"{', causal' if r.causal else ''}", fontsize=11)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)  # below: hides no point
    fig.tight_layout()


ROOFLINE_FIGSIZE = (8, 6.2)


def roofline_figure(hardware="h100_sxm", seqlen=4096, head_dim=64, dtype="float16", causal=False, show="both",
                    measurement: measure.Measurement | None = None):
    """Static twin of ``roofline_explorer``."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=ROOFLINE_FIGSIZE)
    _draw_roofline(fig, roofline_numbers(hardware, seqlen, head_dim, dtype, causal, show, measurement))
    return fig


def roofline_explorer(hardware="h100_sxm", seqlen=4096, head_dim=64, dtype="float16", causal=False, show="both",
                      measurement: measure.Measurement | None = None):
    """Hardware, N, D, dtype, causal, naive vs flash -> points on the roofline, with this machine's."""
    widgets = _import_widgets()
    measurement = measurement or this_machine()
    controls = {
        "hardware": _dropdown(widgets, "hardware", _hardware_options(), presets.hardware(hardware).key),
        "seqlen": _selection_slider(widgets, "N", SEQLENS, seqlen),
        "head_dim": _dropdown(widgets, "D", list(HEAD_DIMS), head_dim),
        "dtype": _dropdown(widgets, "dtype", list(DTYPES), rules.dtype_name(dtype)),
        "causal": widgets.Checkbox(description="causal", value=bool(causal)),
        "show": widgets.ToggleButtons(options=["naive", "flash", "both"], value=show),
    }
    compute = functools.partial(roofline_numbers, measurement=measurement)
    return _explorer_class()("roofline-explorer", controls, compute, _draw_roofline, ROOFLINE_FIGSIZE)
