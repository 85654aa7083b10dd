"""One figure style for the lectures and the widgets: same rcParams, sharp PNGs shown at their figsize."""
import json

import matplotlib

matplotlib.use("agg")

import matplotlib.pyplot as plt
import pytest

from course_lib.views import figstyle, widgets

from conftest import REPO

LECTURES_WITH_FIGURES = sorted(p for p in (REPO / "notebooks").glob("*.ipynb") if not p.name.startswith("00_"))


def test_inline_figure_is_drawn_at_1_6x_shown_at_its_figsize():
    with figstyle.context():
        fig, ax = plt.subplots(figsize=(5, 2))
        ax.plot([0, 1], [0, 1])
        data, metadata = figstyle._inline_png(fig)
        plt.close(fig)
    width, height = figstyle.png_size(data)
    assert data[:4] == b"\x89PNG"
    assert metadata["width"] == pytest.approx(width * figstyle.SHOWN_DPI / figstyle.PNG_DPI, abs=1)
    assert 400 < metadata["width"] <= 500  # about 5 in at 100 px per inch (bbox_inches="tight" trims a little)
    assert width >= 1.5 * metadata["width"]  # real pixels for a high-DPI screen, not an upscaled 1x image


def test_a_palette_png_is_smaller_than_matplotlibs_own():
    import io

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(100), [x ** 0.5 for x in range(100)], label="a line")
    ax.legend()
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=figstyle.PNG_DPI)
    assert len(figstyle.png_bytes(fig)) < len(plain.getvalue())
    plt.close(fig)


def test_the_widgets_draw_in_the_same_style_and_resolution():
    assert widgets.PNG_DPI == figstyle.PNG_DPI and widgets.SHOWN_DPI == figstyle.SHOWN_DPI
    seen = {}

    def draw(fig, result):
        seen["font.size"] = matplotlib.rcParams["font.size"]
        seen["legend.fontsize"] = matplotlib.rcParams["legend.fontsize"]
        fig.subplots().plot([0, 1])

    png = widgets._png(draw, None, (4, 3))
    assert seen == {"font.size": figstyle.RC["font.size"], "legend.fontsize": figstyle.RC["legend.fontsize"]}
    assert figstyle.png_size(png)[0] == 4 * figstyle.PNG_DPI


@pytest.mark.parametrize("path", LECTURES_WITH_FIGURES, ids=lambda p: p.stem)
def test_every_lecture_applies_the_style_in_its_setup_cell(path):
    nb = json.loads(path.read_text())
    setup = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "figstyle.use()" in setup, f"{path.name}: its first code cell should call figstyle.use()"


def test_stored_widget_figure_is_shown_at_its_figsize():
    box = widgets.tile_size_explorer()
    data, metadata = box._repr_mimebundle_()
    width, _ = figstyle.png_size(box.image.value)
    assert "image/png" in data
    assert metadata["image/png"]["width"] == round(width * figstyle.SHOWN_DPI / figstyle.PNG_DPI)
