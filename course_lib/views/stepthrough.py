"""Step through the online softmax: m, l and O as K/V tiles stream past one query tile.

``trace_query_tile`` runs chapter 04's update on one query tile and records the
state after every key/value tile; ``draw_step`` draws that state (the static
figure, readable in nbviewer and under nbval); ``stepthrough_widget`` puts a
slider over the same figure.

    trace = demo_trace()
    draw_step(trace, 3)          # static twin
    stepthrough_widget(trace)    # the widget: a slider over the same figure
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from ..core.online_softmax import finalize, init_state, online_update, safe_softmax
from ..core.reference import safe_max
from . import figstyle


@dataclass
class Step:
    """The running state of a query tile after key/value tiles 0..j."""

    j: int                 # index of the tile just folded in
    cols: tuple            # its keys [c0, c1)
    m: np.ndarray          # (Br,) running max
    l: np.ndarray          # (Br,) running sum, relative to m
    O: np.ndarray          # (Br, Dv) unnormalised output
    alpha: np.ndarray      # (Br,) the rescale exp(m_old - m_new) this step applied


@dataclass
class Trace:
    """A query tile, its scores, the steps of the online softmax and the exact answer."""

    S: np.ndarray          # (Br, Nk) scores, -inf where hidden (drawn, never used by the update)
    block_k: int
    steps: list = field(default_factory=list)
    out: np.ndarray = None  # (Br, Dv) softmax(S) V, computed directly
    lse: np.ndarray = None  # (Br,)

    @property
    def Tc(self) -> int:
        return len(self.steps)


def trace_query_tile(q_tile, k, v, block_k, softmax_scale=None, visible=None) -> Trace:
    """Run the online softmax over K/V tiles of ``block_k`` keys for one query tile.

    q_tile: (Br, D); k: (Nk, D); v: (Nk, Dv); ``visible``: optional (Br, Nk) mask.
    """
    q_tile, k, v = (np.asarray(x, dtype=np.float64) for x in (q_tile, k, v))
    scale = 1.0 / math.sqrt(q_tile.shape[1]) if softmax_scale is None else softmax_scale
    S = scale * q_tile @ k.T
    if visible is not None:
        S = np.where(visible, S, -np.inf)
    m, l, O = init_state(q_tile.shape[0], v.shape[1])
    trace = Trace(S=S, block_k=block_k)
    for j, c0 in enumerate(range(0, k.shape[0], block_k)):
        c1 = min(c0 + block_k, k.shape[0])
        m_old = m
        m, l, O, _ = online_update(m, l, O, S[:, c0:c1], v[c0:c1])
        alpha = np.exp(m_old - safe_max(m))
        trace.steps.append(Step(j, (c0, c1), m.copy(), l.copy(), O.copy(), alpha))
    trace.out = safe_softmax(S) @ v
    trace.lse = finalize(m, l, O)[1]
    return trace


def demo_trace(rows=4, seqlen_k=40, head_dim=8, block_k=8, seed=0) -> Trace:
    """A small, seeded example in which a late tile raises a row's max (so l and O get rescaled)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, head_dim))
    k = rng.standard_normal((seqlen_k, head_dim))
    v = rng.standard_normal((seqlen_k, head_dim))
    # a key that row 0 likes a lot, in the fourth tile: its max jumps there
    surprise = min(3 * block_k + 2, seqlen_k - 1)
    k[surprise] = 2.5 * q[0] / np.linalg.norm(q[0]) * math.sqrt(head_dim)
    return trace_query_tile(q, k, v, block_k)


def _running(trace, step, name):
    return np.array([getattr(s, name) for s in trace.steps[:step]])  # (step, Br)


def draw_step(trace: Trace, step: int, fig=None):
    """The state after ``step`` key/value tiles (1 .. Tc): the static figure.

    Top: the query tile's scores, tiles already folded in bright, the current
    one outlined, the rest not yet seen.  Bottom: the running max m, the
    running sum l (it drops when m jumps: the rescale), and how far the running
    output O / l still is from the exact answer.
    """
    if not 1 <= step <= trace.Tc:
        raise ValueError(f"step must be between 1 and {trace.Tc} (the number of K/V tiles), got {step}")
    fig = fig or plt.figure(figsize=(11, 6.2))
    fig.clf()
    grid = fig.add_gridspec(2, 3, height_ratios=[1, 1.15], hspace=0.45, wspace=0.35, right=0.88)  # room for the rows' key
    Br, Nk = trace.S.shape
    current = trace.steps[step - 1]
    colours = plt.cm.tab10(np.arange(Br) % 10)

    ax = fig.add_subplot(grid[0, :])
    finite = trace.S[np.isfinite(trace.S)]
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (0, 1)
    ax.imshow(np.where(np.isfinite(trace.S), trace.S, np.nan), aspect="auto", cmap="viridis",
              vmin=vmin, vmax=vmax, interpolation="nearest")
    c0, c1 = current.cols
    ax.add_patch(Rectangle((c1 - 0.5, -0.5), Nk - c1, Br, color="white", alpha=0.75, lw=0))
    ax.add_patch(Rectangle((c0 - 0.5, -0.5), c1 - c0, Br, fill=False, ec="red", lw=2.5))
    for edge in range(trace.block_k, Nk, trace.block_k):
        ax.axvline(edge - 0.5, color="black", lw=0.6)
    ax.set_yticks(range(Br))
    ax.set_xlabel("key j")
    ax.set_ylabel("query row")
    ax.set_title(f"scores of one query tile: K/V tile {step} of {trace.Tc} (keys {c0}-{c1 - 1}) "
                 f"just folded in (red), later tiles not yet seen (pale)")

    steps = np.arange(1, step + 1)
    ax_m = fig.add_subplot(grid[1, 0])
    ax_l = fig.add_subplot(grid[1, 1])
    ax_e = fig.add_subplot(grid[1, 2])
    m_hist, l_hist = _running(trace, step, "m"), _running(trace, step, "l")
    alpha_hist = _running(trace, step, "alpha")
    final_m = np.max(trace.S, axis=1)
    exact = trace.out
    err = np.array([np.max(np.abs(finalize(s.m, s.l, s.O)[0] - exact), axis=1) for s in trace.steps[:step]])
    for r in range(Br):
        ax_m.plot(steps, m_hist[:, r], "o-", color=colours[r], ms=4, label=f"{r}")
        ax_m.axhline(final_m[r], color=colours[r], ls=":", lw=1)
        ax_l.plot(steps, l_hist[:, r], "o-", color=colours[r], ms=4)
        rescaled = (alpha_hist[:, r] < 1) & (alpha_hist[:, r] > 0)  # 0: nothing to rescale yet
        ax_l.plot(steps[rescaled], l_hist[rescaled, r], "x", color="red", ms=9, mew=2)
        ax_e.semilogy(steps, np.maximum(err[:, r], 1e-17), "o-", color=colours[r], ms=4)
    for a, title in ((ax_m, "running max m\n(dotted: the row's true max)"),
                     (ax_l, "running sum l = sum exp(s - m)\n(red x: m rose, l rescaled by alpha)"),
                     (ax_e, "max |O / l - exact output|\nof the row so far")):
        a.set_title(title, fontsize=10)
        a.set_xlabel("K/V tiles folded in")
        a.set_xlim(0.5, trace.Tc + 0.5)
    ax_e.set_ylim(1e-17, 10)
    # one key for the three panels, right of them: inside a panel it would hide lines and points
    ax_e.legend(*ax_m.get_legend_handles_labels(), title="query row", loc="center left", bbox_to_anchor=(1.03, 0.5))
    return fig


def _png(fig) -> bytes:
    return figstyle.png_bytes(fig)


def stepthrough_widget(trace: Trace | None = None, start: int = 1):
    """A slider over ``draw_step``: drag it to stream the K/V tiles past the query tile.

    Returns an ipywidgets ``VBox`` of the slider and the figure as a PNG image
    (no Output widget, so it executes cleanly headless).  ``box.slider`` drives
    it; ``box.figure`` is the matplotlib figure drawn last.
    """
    import ipywidgets as widgets
    from matplotlib.figure import Figure

    from .widgets import figure_box_class, figure_image

    trace = trace if trace is not None else demo_trace()
    slider = widgets.IntSlider(value=start, min=1, max=trace.Tc, step=1, description="K/V tiles",
                               continuous_update=False)
    image = figure_image(widgets, (11, 6.2))
    box = figure_box_class()([slider, image])
    box.description = "the online-softmax step-through"
    box.add_class("stepthrough")
    box.slider, box.image, box.trace = slider, image, trace

    def redraw(change=None):
        with figstyle.context():
            box.figure = draw_step(trace, slider.value, fig=Figure(figsize=(11, 6.2)))  # not tracked by pyplot
        image.value = _png(box.figure)

    slider.observe(redraw, names="value")
    redraw()
    return box
