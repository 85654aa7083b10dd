"""What a lecture's figures show a reader: no text below 9 pt, and no figure twice in a row.

A figure is drawn at 1.6x and shown at its figsize, so a font size in points is the size a
reader sees.  The tests read every explicit font size in the lectures' code cells and in
``course_lib/views``, and the font sizes of the figure style's rcParams.  An explorer's stored
output is its figure (that is what the web shows), so the next cell must not draw it again
with the explorer's static twin.
"""
import re

import nbformat
import pytest

from course_lib.views import figstyle

from conftest import REPO

MIN_POINTS = 9
LECTURES = sorted((REPO / "notebooks").glob("*.ipynb"))
VIEWS = sorted((REPO / "course_lib" / "views").glob("*.py"))

# fontsize=7, labelsize=7, title_fontsize=7, .set_fontsize(7), {"size": 7} / size=7 inside a prop or fontdict
NUMERIC = re.compile(r"(?:fontsize|labelsize|titlesize)\s*=\s*(\d+(?:\.\d+)?)"
                     r"|set_(?:font)?size\(\s*(\d+(?:\.\d+)?)"
                     r"|[\"']size[\"']\s*:\s*(\d+(?:\.\d+)?)")
# the named sizes below the base size: "small" is 0.833 of 10 pt
NAMED = re.compile(r"(?:fontsize|labelsize|titlesize|size)\s*=\s*[\"'](xx-small|x-small|small|smaller)[\"']")


def small_sizes(source: str):
    """(line number, text) of every explicit font size below MIN_POINTS in ``source``."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        for match in NUMERIC.finditer(code):
            size = float(next(g for g in match.groups() if g is not None))
            if size < MIN_POINTS:
                found.append((number, line.strip()))
        if NAMED.search(code):
            found.append((number, line.strip()))
    return found


def test_the_scanner_sees_every_way_of_writing_a_small_size():
    source = "\n".join(["ax.legend(fontsize=7)", "ax.tick_params(labelsize=6)", "ax.title.set_fontsize(8)",
                        "ax.legend(prop={'size': 5})", "ax.text(0, 0, 's', fontsize='small')",
                        "ax.set_title(t,\n    fontsize=8.5)", "ax.legend(fontsize=9)  # fontsize=5 in a comment"])
    assert [n for n, _ in small_sizes(source)] == [1, 2, 3, 4, 5, 7]


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.name)
def test_lecture_figures_have_no_text_below_9_pt(path):
    nb = nbformat.reads(path.read_text(), as_version=4)
    small = [f"cell {cell.get('id')} line {n}: {line}" for cell in nb.cells if cell.cell_type == "code"
             for n, line in small_sizes(cell.source)]
    assert not small, f"{path.name}: text below {MIN_POINTS} pt:\n" + "\n".join(small)


@pytest.mark.parametrize("path", VIEWS, ids=lambda p: p.name)
def test_views_have_no_text_below_9_pt(path):
    small = [f"line {n}: {line}" for n, line in small_sizes(path.read_text())]
    assert not small, f"{path.name}: text below {MIN_POINTS} pt:\n" + "\n".join(small)


def test_figure_style_fonts_are_at_least_9_pt():
    fonts = {k: v for k, v in figstyle.RC.items() if k == "font.size" or k.endswith(("fontsize", "labelsize", "titlesize"))}
    assert "font.size" in fonts and "xtick.labelsize" in fonts  # the keys the scan is meant to cover
    small = {k: v for k, v in fonts.items() if not isinstance(v, (int, float)) or v < MIN_POINTS}
    assert not small, f"figstyle.RC fonts below {MIN_POINTS} pt (or named, relative sizes): {small}"


EXPLORER_CALL = re.compile(r"\b(\w+)_explorer\(")


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.name)
def test_an_explorers_stored_figure_is_not_drawn_again_by_its_twin(path):
    code = [cell for cell in nbformat.reads(path.read_text(), as_version=4).cells if cell.cell_type == "code"]
    twice = []
    for cell, following in zip(code, code[1:]):
        shows_png = any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))
        for name in EXPLORER_CALL.findall(cell.source):
            if shows_png and re.search(rf"\b{name}_figure\(", following.source):
                twice.append(f"{cell.get('id')} then {following.get('id')}: {name}")
    assert not twice, f"{path.name}: the explorer's figure, then its static twin's, in a row: {twice}"
