"""The roofline drawn: the roofs of machines, presets or measured, with kernels as points on them."""
from __future__ import annotations

import math

import numpy as np

from ..core.hardware import hardware
from ..core.rules import dtype_name
from ..models.measure import Measurement

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


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
        colour = COLOURS[n % len(COLOURS)]
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
    ax.legend(loc="lower right")
    return ax


def plot_roofline(machines=("h100_sxm", "a100_80gb", "l4"), points=(), *, dtype="float16",
                  source="datasheet", title=None, figsize=(7.5, 4.5)):
    """A roofline figure of ``machines`` with ``points`` on it (see ``draw_roofline``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    draw_roofline(ax, machines, points, dtype=dtype, source=source)
    ax.set_title(title or f"Roofline ({dtype_name(dtype)})", fontsize=10)
    fig.tight_layout()
    return fig
