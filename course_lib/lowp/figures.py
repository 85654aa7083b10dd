"""Chapter 11's figures: the formats, the error study, where the conversion sits, FA3's timelines.

Each function draws one figure and returns it; the data come as arguments
(records read by the lecture, or a schedule's spans), so nothing here measures.
"""
from __future__ import annotations

import numpy as np

from ..views.figstyle import CYCLE
from .formats import FORMATS, spacing

FORMAT_COLOURS = {"float32": "#404040", "float16": CYCLE[0], "bfloat16": CYCLE[2], "float8_e4m3fn": CYCLE[3],
                  "float8_e5m2": CYCLE[1]}
STAGE_COLOURS = {"load K": CYCLE[7], "load V": "#bbbbbb", "gemm0": CYCLE[0], "softmax": CYCLE[1], "gemm1": CYCLE[2]}


def draw_formats():
    """Left: each format's range, subnormals to the largest value, on a log axis.  Right: the
    relative spacing of each format against the magnitude of the value, across its range."""
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = ["float8_e4m3fn", "float8_e5m2", "float16", "bfloat16"]
    for row, name in enumerate(names):
        f = FORMATS[name]
        colour = FORMAT_COLOURS[name]
        ax.plot([f.smallest_subnormal, f.smallest_normal], [row, row], color=colour, lw=3, alpha=0.35)
        ax.plot([f.smallest_normal, f.max], [row, row], color=colour, lw=7, solid_capstyle="butt")
        ax.text(f.max * 3, row, f"max {f.max:.4g}", va="center", fontsize=9)
        x = np.logspace(np.log10(f.smallest_subnormal), np.log10(f.max), 400)
        bx.loglog(x, spacing(x, name) / x, color=colour, label=name)
    ax.set_yticks(range(len(names)), names)
    ax.set_xscale("log")
    ax.set_xlim(1e-42, 1e45)
    ax.set_xlabel("|value| (thin: subnormals; thick: normal range)")
    ax.set_title("range of each format")
    ax.grid(True, axis="x")
    bx.set_xlabel("|value|")
    bx.set_ylabel("spacing / value")
    bx.set_title("relative spacing: flat where normal")
    bx.legend(loc="upper right")
    bx.grid(True)
    fig.tight_layout()
    return fig


YLABELS = {"out_max": "max |out - exact|", "lse_max": "max |lse - exact|",
           "out_rel_rms": "RMS(out - exact) / RMS(out)", "kl_mean": "mean KL of the rows (nats)"}


def _series(records, sweep, recipe, field="out_max"):
    rows = sorted((r["x"], r[field]) for r in records if r["sweep"] == sweep and r["recipe"] == recipe)
    return [x for x, _ in rows], [y for _, y in rows]


def _spread(records, sweep, recipe):
    """(below, above) the mean: the smallest and largest draw of out_rel_rms at each point, sorted by x."""
    rows = sorted((r["x"], r["out_rel_rms"], r["out_rel_rms_range"]) for r in records
                  if r["sweep"] == sweep and r["recipe"] == recipe)
    return [[y - lo for _, y, (lo, _) in rows], [hi - y for _, y, (_, hi) in rows]]


def draw_error_study(records, field="out_max"):
    """Three panels from ``lowp_error`` records: error against row length, logit scale and K's outlier."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    panels = [("length", ["fp8", "fp8 FA3", "bf16", "fp16"], "keys per row (Nk)"),
              ("scale", ["fp8", "fp8 FA3", "bf16", "fp16"], "logit scale (q multiplied by it)"),
              ("outlier", ["fp8 per-tensor", "fp8", "fp8 incoherent", "fp16"], "K's outlier channel, x times")]
    colours = {"fp8": CYCLE[3], "fp8 FA3": CYCLE[5], "bf16": CYCLE[2], "fp16": CYCLE[0], "fp8 per-tensor": CYCLE[4],
               "fp8 incoherent": CYCLE[1]}
    for ax, (sweep, recipes, xlabel) in zip(axes, panels):
        for name in recipes:
            x, y = _series(records, sweep, name, field)
            style = dict(color=colours[name], label=name, ls="--" if name == "fp8 FA3" else "-", marker="o")
            seeded = [r for r in records if r["sweep"] == sweep and r["recipe"] == name and len(r["seeds"]) > 1]
            if field == "out_rel_rms" and seeded:   # the mean of several draws, with their range
                ax.errorbar(x, y, yerr=_spread(records, sweep, name), capsize=3, **style)
            else:
                ax.plot(x, y, **style)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True)
        ax.legend(loc="lower right" if sweep == "outlier" else "best")
    axes[0].set_ylabel(YLABELS.get(field, field))
    axes[0].set_title("longer rows")
    axes[1].set_title("sharper softmax")
    axes[2].set_title("outliers in K")
    fig.tight_layout()
    return fig


def draw_sources(records, field="out_max"):
    """Error against row length with each source switched on alone, beside the full recipes."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    styles = {"fp8": ("-", CYCLE[3]), "fp8 inputs alone": ("--", CYCLE[3]), "fp8 P alone": (":", CYCLE[3]),
              "fp8 FA3 P alone": (":", CYCLE[5]),
              "fp16": ("-", CYCLE[0]), "fp16 inputs alone": ("--", CYCLE[0]), "fp16 P alone": (":", CYCLE[0]),
              "fp16 accumulator alone": ("-.", CYCLE[2])}
    for name, (ls, colour) in styles.items():
        x, y = _series(records, "length", name, field)
        ax.loglog(x, y, ls, marker="o", color=colour, label=name)
    ax.set_xlabel("keys per row (Nk)")
    ax.set_ylabel(YLABELS.get(field, field))
    ax.set_title("where the error comes from: one source at a time")
    ax.grid(True)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def draw_conversion(records):
    """Median time of each place of the conversion (bars), min to max (whiskers), per format."""
    import matplotlib.pyplot as plt

    places = ["float32 K (no conversion)", "once", "tile", "in_loop"]
    dtypes = ["float8_e4m3fn", "float16"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.38
    for i, dtype in enumerate(dtypes):
        rows = {r["place"]: r for r in records if r.get("kind") == "place" and r["dtype"] == dtype}
        med = np.array([rows[p]["median_s"] for p in places]) * 1e3
        low = med - np.array([rows[p]["min_s"] for p in places]) * 1e3
        high = np.array([rows[p]["max_s"] for p in places]) * 1e3 - med
        ax.bar(np.arange(len(places)) + (i - 0.5) * width, med, width, yerr=[low, high], capsize=3,
               color=FORMAT_COLOURS[dtype], label=f"K in {dtype}")
    ax.set_xticks(range(len(places)), ["float32 K\n(no conversion)", "converted once\nbefore the loop",
                                       "converted per tile\n(once per query tile)", "converted at\nevery use"])
    ax.set_ylabel("ms (median; min to max)")
    ax.legend(loc="upper left")
    ax.grid(True, axis="y")
    fig.tight_layout()
    return fig


def draw_timeline(runs: dict, until=None):
    """One Gantt chart per schedule (``runs``: name -> ``overlap.run(...)``): a row per resource,
    a bar per operation, coloured by stage; ``until`` cuts the time axis (seconds)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.3 + 1.05 * len(runs)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, (name, result) in zip(axes, runs.items()):
        spans = result["spans"]
        resources = sorted({s.op.resource for s in spans}, key=lambda r: ("tma", "tc", "alu0", "alu1").index(r))
        for row, resource in enumerate(resources):
            for s in spans:
                if s.op.resource == resource:
                    ax.barh(row, (s.end - s.start) * 1e6, left=s.start * 1e6, height=0.7,
                            color=STAGE_COLOURS[s.op.name], edgecolor="white", linewidth=0.5,
                            hatch="//" if s.op.wg == 1 else None)
        labels = {"tma": "producer (TMA)", "tc": "tensor cores", "alu0": "warpgroup 1", "alu1": "warpgroup 2"}
        ax.set_yticks(range(len(resources)), [labels[r] for r in resources])
        ax.invert_yaxis()
        ax.set_title(f"{name}: tensor cores busy {100 * result['tc_busy']:.0f}% of the time", loc="left")
        ax.grid(True, axis="x")
    if until is not None:
        axes[-1].set_xlim(0, until * 1e6)
    axes[-1].set_xlabel("time (µs)")
    handles = [Patch(color=c, label=n) for n, c in STAGE_COLOURS.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="warpgroup 2's op"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _register_notes(regs, prefix, noun):
    """One line per register: the rows and columns (keys) it holds in the 16 x 16 map."""
    notes = []
    for r in range(4):
        rows, cols = np.nonzero(regs == r)
        cols = sorted(set(cols))
        if cols == list(range(cols[0], cols[-1] + 1)):
            where = f"{noun} {cols[0]}-{cols[-1]}"
        else:
            where = f"{'even' if cols[0] % 2 == 0 else 'odd'} {noun}"
        notes.append(f"{prefix}{r}: rows {rows.min()}-{rows.max()}, {where}")
    return notes


def draw_fragments(a_word, c_elem):
    """Which lane holds each element of a warp's mma fragments (``mma.a_word`` / ``mma.c_elem``, passed in):
    left, the 16 x 16 A tile of halves (a word is two neighbouring halves); right, two 16 x 8 C tiles of
    float32 side by side, the same 16 x 16 keys.  Colour = the lane's quad (lane // 4: the row it holds),
    number = the lane; white lines split the registers (a0-a3, c0-c3), named under each map."""
    import matplotlib.pyplot as plt

    lane_a, reg_a = np.zeros((16, 16), int), np.zeros((16, 16), int)
    lane_c, reg_c = np.zeros((16, 16), int), np.zeros((16, 16), int)
    for lane in range(32):
        for r in range(4):
            row, word = a_word(lane, r)
            lane_a[row, 2 * word:2 * word + 2], reg_a[row, 2 * word:2 * word + 2] = lane, r
            for tile in range(2):
                row, col = c_elem(lane, r)
                lane_c[row, 8 * tile + col], reg_c[row, 8 * tile + col] = lane, r
    fig, axes = plt.subplots(1, 2, figsize=(13, 7.4))
    panels = ((axes[0], lane_a, reg_a, "a", "A fragment: P (16 rows x 16 keys) in halves"),
              (axes[1], lane_c, reg_c, "c", "C fragments: S, two 16 x 8 tiles (float32)"))
    for ax, lanes, regs, name, title in panels:
        ax.imshow(lanes // 4 % 8, cmap="tab10", vmin=0, vmax=9, alpha=0.55)
        for i in range(16):
            for j in range(16):
                ax.text(j, i, f"{lanes[i, j]}", ha="center", va="center", fontsize=9)
        ax.axhline(7.5, color="white", lw=3)
        ax.axvline(7.5, color="white" if name == "a" else "black", lw=3 if name == "a" else 1.5)
        ax.set_xticks(range(16))
        ax.set_yticks(range(16))
        ax.set_xlabel("key (column)")
        ax.set_ylabel("query row")
        ax.set_title(title)
        notes = _register_notes(regs, name, "keys")
        ax.text(0.5, -0.09, f"{notes[0]};  {notes[2]}\n{notes[1]};  {notes[3]}", transform=ax.transAxes,
                ha="center", va="top", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
