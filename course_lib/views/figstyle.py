"""One look for every figure of the course: sizes, fonts, colours, grid, and sharp PNGs.

Each lecture's setup cell calls ``figstyle.use()`` once; the widgets draw inside
``figstyle.context()``, so an explorer's figure looks like the lecture's around it.

Sharpness: a figure is laid out at ``SHOWN_DPI`` (so ``figsize=(8, 3)`` is 800 x 300
pixels on the page, as before) but its PNG is drawn at ``PNG_DPI``, 1.6 times the
pixels, and the notebook is told its display size.  A high-DPI screen then shows
real pixels instead of an upscaled, blurry copy.  The PNG is stored with a palette
of 256 colours (plots are mostly flat colour), which keeps a 1.6x figure smaller
than a plain 1x one: the committed notebooks do not grow.

The colours are matplotlib's default cycle (``C0`` .. ``C9``), named here so that a
figure can say ``figstyle.COLOURS["flash"]`` for the same thing in every chapter.
"""
from __future__ import annotations

import contextlib
import io
import struct

SHOWN_DPI = 100  # CSS pixels per inch of figsize on the page (and in ``<Figure size 800x300 ...>``)
PNG_DPI = 160  # pixels per inch drawn: 1.6x, sharp on a high-DPI screen

# The default cycle, by what the course draws with it.
CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")
COLOURS = {"flash": CYCLE[0], "fa1": CYCLE[1], "model": CYCLE[2], "naive": CYCLE[3], "measured": CYCLE[4],
           "reference": "#404040"}

RC = {
    "figure.dpi": SHOWN_DPI,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.framealpha": 0.85,
    "figure.titlesize": 11,
    "grid.color": "#b0b0b0",
    "grid.alpha": 0.4,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
}


def _rc():
    from cycler import cycler

    return {**RC, "axes.prop_cycle": cycler(color=list(CYCLE))}


def png_bytes(fig, *, dpi: int = PNG_DPI, bbox_inches=None) -> bytes:
    """``fig`` as PNG bytes at ``dpi``, with a 256-colour palette (the same picture, a third of the bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches=bbox_inches)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow comes with matplotlib
        return buf.getvalue()
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="png", optimize=True)
    return out.getvalue()


def png_size(data: bytes) -> tuple:
    """(width, height) in pixels, read from a PNG's header."""
    return struct.unpack(">II", data[16:24])


def _inline_png(fig):
    """The notebook's PNG of a figure: drawn at PNG_DPI, shown at SHOWN_DPI (IPython's (data, metadata))."""
    if not fig.axes and not fig.texts and not fig.images:
        return None  # an empty figure shows nothing, as matplotlib's own formatter does
    data = png_bytes(fig, bbox_inches="tight")
    width, height = png_size(data)
    scale = PNG_DPI / SHOWN_DPI
    return data, {"width": round(width / scale), "height": round(height / scale)}


def use():
    """The course's figure style for this notebook: rcParams, and sharp inline PNGs.  Call it once, in the setup cell."""
    import matplotlib

    matplotlib.rcParams.update(_rc())
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - plain Python: rcParams are all there is to set
        return
    shell = get_ipython()
    if shell is None:
        return
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    # Load the notebook's backend now: the inline backend registers its own PNG formatter when it
    # loads (at the first figure, otherwise), and would replace ours.
    plt.switch_backend(matplotlib.get_backend())

    formatters = shell.display_formatter.formatters
    for mime in ("image/svg+xml", "image/jpeg", "application/pdf"):
        formatters[mime].type_printers.pop(Figure, None)
    formatters["image/png"].for_type(Figure, _inline_png)


@contextlib.contextmanager
def context():
    """The style for figures drawn outside a notebook's setup (the widgets' PNGs)."""
    import matplotlib

    with matplotlib.rc_context(_rc()):
        yield


def log_ticks(ax, axis="both"):
    """Label a log axis at 1, 2 and 5 of each decade, in plain numbers: matplotlib labels only the powers
    of ten, and an axis spanning less than a decade or two is left with one labelled tick."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for which in ("x", "y") if axis == "both" else (axis,):
        a = getattr(ax, f"{which}axis")
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_minor_formatter(NullFormatter())
