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

from ..core.masks import EMPTY, FULL, PARTIAL, MaskSpec

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


MAX_DRAWN_TILES = 48  # per axis: beyond it the grid lines would be all there is to see


def plot_tile_map(seqlen_q, seqlen_k, block_q, block_k, *, causal=False,
                  causal_align="bottom_right", window_size=(-1, -1), ax=None):
    """The static tile map: each element coloured by its tile's kind, hidden (masked) pairs paler.

    Drawn as one image whatever the size (a 256 x 256 map of 1 x 1 tiles is as
    quick as a 4 x 4 one); tile borders are drawn while there are at most
    ``MAX_DRAWN_TILES`` tiles per axis, and the title says when they are not.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    mask = MaskSpec(seqlen_q, seqlen_k, causal, causal_align, tuple(window_size))
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5 * max(seqlen_q, 1) / max(seqlen_k, 1) + 0.8))
    kinds = mask.tile_map(block_q, block_k)
    per_element = np.repeat(np.repeat(kinds, block_q, axis=0), block_k, axis=1)[:seqlen_q, :seqlen_k]
    rgb = np.zeros(per_element.shape + (3,))
    for kind, colour in COLOURS.items():
        rgb[per_element == kind] = to_rgb(colour)
    visible = mask.visible(np.arange(seqlen_q), np.arange(seqlen_k))
    rgb = np.where(visible[..., None], rgb, 0.3 * rgb + 0.7)  # hidden (query, key) pairs: the same colour, paler
    ax.imshow(rgb, interpolation="nearest", aspect="auto", extent=(-0.5, seqlen_k - 0.5, seqlen_q - 0.5, -0.5))
    grid = kinds.shape[0] <= MAX_DRAWN_TILES and kinds.shape[1] <= MAX_DRAWN_TILES
    if grid:
        for i in range(1, kinds.shape[0]):
            ax.axhline(i * block_q - 0.5, color="black", lw=0.8)
        for j in range(1, kinds.shape[1]):
            ax.axvline(j * block_k - 0.5, color="black", lw=0.8)
    ax.set_xlim(-0.5, seqlen_k - 0.5)
    ax.set_ylim(seqlen_q - 0.5, -0.5)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    grid_note = "" if grid else " (too many tiles to draw their borders)"
    counts = str(tile_counts(mask, block_q, block_k)).replace(" -> ", "\n-> ")
    ax.set_title(f"Nq={seqlen_q}, Nk={seqlen_k}, tiles {block_q}x{block_k}{grid_note}\n{counts}", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()]
              + [Patch(color="#bbbbbb", label="hidden pairs: paler")],
              loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax.figure


def tile_map_explorer(seqlen_q=48, seqlen_k=64, block_q=16, block_k=16):
    """Sliders for Nq, Nk, Br, Bc and the mask; the tile map redraws below when a slider is released.

    Returns the ipywidgets box; its ``.controls`` dict holds the sliders and
    ``.counts`` the TileCounts of the map on display (tests drive both).
    """
    import html

    import ipywidgets as W
    from matplotlib.figure import Figure

    from . import figstyle
    from .widgets import figure_box_class, figure_image

    slider = dict(continuous_update=False)  # redraw on release, not on every pixel of a drag
    controls = dict(
        seqlen_q=W.IntSlider(seqlen_q, 1, 256, description="Nq", **slider),
        seqlen_k=W.IntSlider(seqlen_k, 1, 256, description="Nk", **slider),
        block_q=W.IntSlider(block_q, 1, 64, description="Br", **slider),
        block_k=W.IntSlider(block_k, 1, 64, description="Bc", **slider),
        causal=W.Checkbox(True, description="causal"),
        causal_align=W.Dropdown(options=["bottom_right", "top_left"], description="align"),
        left=W.IntSlider(-1, -1, 256, description="window left", **slider),
        right=W.IntSlider(-1, -1, 256, description="window right", **slider),
    )
    summary = W.HTML()
    summary.add_class("explorer-summary")
    image = figure_image(W, (6.5, 5.2))
    box = figure_box_class()([W.HBox([W.VBox(list(controls.values())[:4]), W.VBox(list(controls.values())[4:])]),
                              summary, image])
    box.description = "the tile-map explorer"
    box.add_class("tile-map-explorer")
    box.image = image

    def redraw(*_):
        v = {name: c.value for name, c in controls.items()}
        window = (v.pop("left"), v.pop("right"))
        mask = MaskSpec(v["seqlen_q"], v["seqlen_k"], v["causal"], v["causal_align"], window)
        box.counts = tile_counts(mask, v["block_q"], v["block_k"])
        with figstyle.context():
            fig = Figure(figsize=(6.5, 5.2))  # not tracked by pyplot
            plot_tile_map(**v, window_size=window, ax=fig.subplots())
            fig.tight_layout()
            image.value = figstyle.png_bytes(fig)  # the figure first, so that a changed summary means both are new
        summary.value = f"<pre style='line-height:1.25'>{html.escape(str(box.counts))}</pre>"

    for c in controls.values():
        c.observe(redraw, names="value")
    box.controls = controls
    redraw()
    return box
