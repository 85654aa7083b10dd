"""What chapters 02-07 say in prose, held to what the library and the records compute.

Each test reads a lecture's markdown (or a stored output) and fails when a sentence states
something the course's own model, record or the cited source contradicts.
"""
import re

import pytest

from course_lib.models import iomodel, sram

from conftest import REPO
from lectures import markdown, output_of


@pytest.mark.parametrize("chapter", ["02", "03"])
def test_the_square_tile_m_over_4db_is_called_an_idealisation_never_a_tile_that_fits(chapter):
    text = markdown(chapter)
    assert "square tile that fits" not in text
    assert "idealis" in text


def test_chapter_02s_table_prints_tiles_that_fit_the_budget_it_names():
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+[\d.]+\s+(\d+) x (\d+)\s+([\d,]+)\s+([\d.]+)$",
                      output_of("02", "2e638081"), re.M)
    assert len(rows) == 4
    for d, idealised, block_q, block_k, used, _intensity in rows:
        d, block_q, block_k = int(d), int(block_q), int(block_k)
        assert (block_q, block_k) == iomodel.fitting_tile(228 * 1024, d, "float16")
        assert int(used.replace(",", "")) == sram.tile_budget(block_q, block_k, d, "float16").total_bytes <= 228 * 1024
        assert sram.tile_budget(int(idealised), int(idealised), d, "float16").total_bytes > 228 * 1024


def test_chapter_02s_shrink_factor_is_the_models():
    low, high = (float(x) for x in re.search(r"is ([\d.]+)-([\d.]+) times\s+shorter", markdown("02")).groups())
    factors = [iomodel.tile_for_sram(228 * 1024, d, "float16") / iomodel.fitting_tile(228 * 1024, d, "float16")[0]
               for d in (32, 64, 128, 256)]
    assert round(min(factors), 1) == low and round(max(factors), 1) == high


def test_chapter_06_says_the_window_rewrite_changes_outputs_when_nq_exceeds_nk():
    text = markdown("06")
    assert "None changes an output both define" not in text
    assert "the window rule does" in text
    assert "Nq=12, Nk=8: window (8, 8) -> FA2 passes on (-1, -1); same mask: False" in output_of("06", "ef132618")


def test_chapter_03_scopes_fa2s_tile_to_sm80_sm90_and_calls_the_register_model_an_upper_bound():
    text = markdown("03")
    assert "sm80 / sm90" in text and "upper bound" in text
    # the model rejects FA2's own D = 64 default (128 x 128, 4 warps), which runs: the chapter says so
    assert not sram.tile_fit(sram.tile_budget(128, 128, 64, "float16"), "h100_sxm", num_warps=4).fits
    assert "rejects FA2's own $D = 64$ default" in text


def test_chapter_03_quotes_the_fit_with_tiles_that_fit():
    fit = iomodel.fit_io_law(iomodel.io_law_points([4096, 8192, 16384], [64, 128], [64 * 1024, 128 * 1024, 256 * 1024],
                                                   "float16", "fa2", tiles="fitting"))
    assert re.search(r"with a larger constant\s+\(about (\d+)\)", markdown("03")).group(1) == f"{fit.c / 4:.0f}"
    assert 1.7 < fit.exponents[1] < 2.0  # "D's exponent a little under 2"


def test_the_tile_size_explorer_draws_what_reaches_hbm_as_chapter_03_promises():
    import matplotlib

    matplotlib.use("Agg")
    from course_lib.views import widgets

    numbers = widgets.tile_size_numbers(64, 64, 64, "float16", "h100_sxm", 8192)
    fig = widgets.tile_size_figure(64, 64, 64, "float16", "h100_sxm", 8192)
    ax_io = fig.axes[1]
    heights = [bar.get_height() for bar in ax_io.patches]
    assert len(heights) == 3 and heights[2] == numbers.flash_levels.hbm_bytes / 2 ** 20
    assert "what reaches HBM while K and V" in markdown("03")


def test_chapter_06_quotes_the_skipping_ratios_of_the_run_it_plots():
    from course_lib import bench

    run = bench.latest_run(bench.load_records(REPO / "notebooks/records/causal_skipping.jsonl",
                                              benchmark="causal_skipping"))
    full = {r["shape"][2]: r for r in run if not r["causal"]}
    causal = {r["shape"][2]: r for r in run if r["causal"]}
    ratios = [full[n]["time_s"] / causal[n]["time_s"] for n in sorted(full)]
    limits = [1 / causal[n]["work_fraction"] for n in sorted(full)]
    text = markdown("06")
    assert f"run {run[0]['run']}" in text
    quoted = re.search(r"sits a little below it, ([\d.]+)-([\d.]+)x against ([\d.]+)-([\d.]+)x", text).groups()
    assert quoted == tuple(f"{x:.2f}" for x in (min(ratios), max(ratios), min(limits), max(limits)))
    assert all(r < lim for r, lim in zip(ratios, limits))  # "a little below": never above what skipping can buy
    assert "should halve the time, and we measure that it does" not in text and "how close a kernel comes" in text
