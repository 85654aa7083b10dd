"""Chapter 15's pictures: schedule timelines, and measured beside modelled pipelines."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .schedule import COMPUTE, LOAD, STORE

KIND_COLOUR = {LOAD: "C0", COMPUTE: "C1", STORE: "C2"}


def plot_timelines(timelines: dict, *, unit: float = 1.0, unit_name: str = "time", title: str | None = None):
    """One row of lanes (DMA engines, compute units) per timeline: bars per step, the buffer written in each.

    ``timelines`` maps a label to an ``edge.schedule.Timeline`` (simulated or measured).
    """
    fig, axes = plt.subplots(len(timelines), 1, figsize=(8.5, 1.15 + 1.05 * len(timelines)), sharex=True,
                             squeeze=False)
    end = max(t.total for t in timelines.values()) / unit
    for ax, (label, timeline) in zip(axes[:, 0], timelines.items()):
        lanes = timeline.lanes()
        for step in timeline.steps:
            y = lanes.index(step.lane)
            ax.barh(y, (step.end - step.start) / unit, left=step.start / unit, height=0.7,
                    color=KIND_COLOUR[step.kind], edgecolor="white", linewidth=0.6)
            width = (step.end - step.start) / unit
            name = str(step.buffer) if step.buffer >= 0 else ("Q" if step.kind == LOAD else "O")
            if width > end / 45:
                ax.text((step.start + step.end) / 2 / unit, y, name, ha="center", va="center", fontsize=9,
                        color="white")
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.4, -0.6)
        ax.set_title(f"{label}: {timeline.total / unit:.3g} {unit_name}", loc="left", fontsize=10)
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlim(0, end * 1.01)
    axes[-1, 0].set_xlabel(unit_name)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOUR.values()]
    fig.legend(handles, ["load (buffer no.; Q: the query tile)", "compute", "store (O)"], loc="lower right", ncol=3,
               frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1 - (0.3 if title else 0) / height))
    return fig


def plot_measured_vs_model(records, *, title: str | None = None):
    """Measured (min / median / max) beside the model and the replay, per buffer count and bandwidth."""
    bandwidths = sorted({r["bandwidth"] for r in records})
    fig, axes = plt.subplots(1, len(bandwidths), figsize=(4.2 * len(bandwidths), 3.4), squeeze=False)
    for ax, bw in zip(axes[0], bandwidths):
        rows = sorted((r for r in records if r["bandwidth"] == bw), key=lambda r: r["buffers"])
        x = np.array([r["buffers"] for r in rows])
        med = np.array([r["measured_s"]["median"] for r in rows])
        lo, hi = med - [r["measured_s"]["min"] for r in rows], [r["measured_s"]["max"] for r in rows] - med
        ax.bar(x - 0.2, med, 0.38, yerr=[lo, hi], capsize=3, color="C4", label="measured (min-median-max)")
        ax.bar(x + 0.2, [r["model_s"]["median"] for r in rows], 0.38, color="C2", label="model (parts alone)")
        ax.plot(x + 0.2, [r["replay_s"]["median"] for r in rows], "k_", markersize=18, mew=2,
                label="replay (own step times)")
        parts = rows[0]["parts"]
        ax.set_title(f"{bw / 1e6:g} MB/s: load {parts['load_s']['median'] * 1e3:.0f} ms, "
                     f"compute {parts['compute_s']['median'] * 1e3:.0f} ms / tile", fontsize=10)
        ax.set_xticks(x, [f"{b} buffer{'s' if b > 1 else ''}" for b in x])
        ax.set_ylabel("seconds per pipeline")
        ax.set_ylim(0, max(r["measured_s"]["max"] for r in rows) * 1.35)
    axes[0, 0].legend(loc="upper right", fontsize=9)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout()
    return fig
