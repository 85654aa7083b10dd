"""Which (Q tile, K tile) pairs a mask leaves work in: the tile map.

A tiled kernel walks a Tr x Tc grid of tiles.  Under a mask each tile is
``empty`` (skip it: no load, no matmul), ``full`` (compute it with no
elementwise mask) or ``partial`` (compute it and mask element by element).
Counting them says how much work the mask saves: causal at Nq = Nk leaves a
little over half the tiles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .masks import EMPTY, FULL, PARTIAL, MaskSpec

COLOURS = {FULL: "#2b7bba", PARTIAL: "#f0a830", EMPTY: "#eeeeee"}


@dataclass(frozen=True)
class TileCounts:
    full: int
    partial: int
    empty: int

    @property
    def total(self) -> int:
        return self.full + self.partial + self.empty

    @property
    def computed(self) -> int:
        return self.full + self.partial

    @property
    def work_fraction(self) -> float:
        """Share of tiles a skipping kernel computes (1.0 when nothing is skipped)."""
        return self.computed / self.total if self.total else 0.0

    def __str__(self):
        return (f"{self.total} tiles: {self.full} full, {self.partial} partial, {self.empty} empty "
                f"-> {self.computed} computed ({100 * self.work_fraction:.1f}% of the work)")


def tile_counts(mask: MaskSpec, block_q: int, block_k: int) -> TileCounts:
    kinds = mask.tile_map(block_q, block_k)
    return TileCounts(*(int(np.sum(kinds == kind)) for kind in (FULL, PARTIAL, EMPTY)))


def plot_tile_map(seqlen_q, seqlen_k, block_q, block_k, *, causal=False,
                  causal_align="bottom_right", window_size=(-1, -1), ax=None):
    """The static tile map: the element mask, with the tile grid and kinds on top."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    mask = MaskSpec(seqlen_q, seqlen_k, causal, causal_align, tuple(window_size))
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5 * max(seqlen_q, 1) / max(seqlen_k, 1) + 0.8))
    kinds = mask.tile_map(block_q, block_k)
    for i in range(kinds.shape[0]):
        for j in range(kinds.shape[1]):
            ax.add_patch(Rectangle((j * block_k - 0.5, i * block_q - 0.5),
                                   min(block_k, seqlen_k - j * block_k), min(block_q, seqlen_q - i * block_q),
                                   facecolor=COLOURS[kinds[i, j]], edgecolor="black", linewidth=1))
    visible = mask.visible(np.arange(seqlen_q), np.arange(seqlen_k))
    rows, cols = np.nonzero(visible)
    ax.scatter(cols, rows, s=max(2, 400 / max(seqlen_q, seqlen_k, 1)), c="black", marker="s", linewidths=0)
    ax.set_xlim(-0.5, seqlen_k - 0.5)
    ax.set_ylim(seqlen_q - 0.5, -0.5)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"Nq={seqlen_q}, Nk={seqlen_k}, tiles {block_q}x{block_k}\n{tile_counts(mask, block_q, block_k)}",
                 fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return ax.figure


def tile_map_explorer(seqlen_q=48, seqlen_k=64, block_q=16, block_k=16):
    """Sliders for Nq, Nk, Br, Bc and the mask; the tile map redraws below.

    Returns the ipywidgets box; its ``.controls`` dict holds the sliders and
    ``.counts`` the TileCounts of the map on display (tests drive both).
    """
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    controls = dict(
        seqlen_q=W.IntSlider(seqlen_q, 1, 256, description="Nq"),
        seqlen_k=W.IntSlider(seqlen_k, 1, 256, description="Nk"),
        block_q=W.IntSlider(block_q, 1, 64, description="Br"),
        block_k=W.IntSlider(block_k, 1, 64, description="Bc"),
        causal=W.Checkbox(True, description="causal"),
        causal_align=W.Dropdown(options=["bottom_right", "top_left"], description="align"),
        left=W.IntSlider(-1, -1, 256, description="window left"),
        right=W.IntSlider(-1, -1, 256, description="window right"),
    )
    out = W.Output()
    summary = W.Label()
    box = W.VBox([W.HBox([W.VBox(list(controls.values())[:4]), W.VBox(list(controls.values())[4:])]),
                  summary, out])

    def redraw(*_):
        v = {name: c.value for name, c in controls.items()}
        window = (v.pop("left"), v.pop("right"))
        mask = MaskSpec(v["seqlen_q"], v["seqlen_k"], v["causal"], v["causal_align"], window)
        box.counts = tile_counts(mask, v["block_q"], v["block_k"])
        summary.value = str(box.counts)
        with out:
            out.clear_output(wait=True)
            fig = plot_tile_map(**v, window_size=window)
            display(fig)
            plt.close(fig)

    for c in controls.values():
        c.observe(redraw, names="value")
    box.controls = controls
    redraw()
    return box
