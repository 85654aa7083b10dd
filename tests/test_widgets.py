"""The explorers, driven through their controls, and their static twins (chapters 02 and 03)."""
import ipywidgets
import matplotlib
import pytest

from course_lib.models import iomodel, measure, roofline, sram
from course_lib.views import widgets

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def measurement():
    """A fixed 'this machine', so the roofline explorer's numbers are exact and the test fast."""
    return measure.Measurement(bandwidth=20e9, flops={"float32": 100e9, "float64": 50e9}, exp_per_s=1e9,
                                cpu="test cpu", threads=2, date="2026-01-01", sram_per_core=2 * 2**20)


@pytest.fixture(scope="module")
def tile_explorer():
    return widgets.tile_size_explorer()


# -- the tile-size explorer --------------------------------------------------------

def test_tile_size_explorer_is_a_box_with_named_controls(tile_explorer):
    assert isinstance(tile_explorer, ipywidgets.VBox)
    assert set(tile_explorer.controls) == {"block_q", "block_k", "head_dim", "dtype", "hardware", "seqlen"}
    assert "tile-size-explorer" in tile_explorer._dom_classes
    assert tile_explorer.image.value[:4] == b"\x89PNG"
    assert tile_explorer.error is None


def test_moving_br_recomputes_the_budget_traffic_and_error(tile_explorer):
    c = tile_explorer.controls
    with tile_explorer.batch():
        c["block_q"].value, c["block_k"].value, c["head_dim"].value = 64, 64, 64
        c["dtype"].value, c["hardware"].value, c["seqlen"].value = "float16", "h100_sxm", 4096
    assert tile_explorer.result.block_q == 64
    before_text, before_png = tile_explorer.summary.value, tile_explorer.image.value
    c["block_q"].value = 128
    r = tile_explorer.result
    assert r.block_q == 128
    assert r.budget == sram.tile_budget(128, 64, 64, "float16")
    assert r.flash == iomodel.flash_io(4096, 4096, 64, "float16", block_q=128, block_k=64)
    assert r.naive == iomodel.naive_io(4096, 4096, 64, "float16")
    assert r.flash_bound == roofline.time_bound(r.flash, "h100_sxm", "float16")
    assert r.occupancy == sram.tile_fit(r.budget, "h100_sxm")
    assert r.run_shape == (2 * 128 + 5, 2 * 64 + 3) and r.within_tolerance and 0 < r.max_error < 1e-2
    assert tile_explorer.summary.value != before_text and tile_explorer.image.value != before_png
    assert f"{r.budget.total_bytes:,} B on chip" in tile_explorer.summary.value


def test_a_tile_too_big_for_the_machine_shows_it_does_not_fit(tile_explorer):
    c = tile_explorer.controls
    with tile_explorer.batch():
        c["hardware"].value, c["head_dim"].value = "rtx_4090", 256
        c["block_q"].value = c["block_k"].value = 256
        assert tile_explorer.result.block_q != 256  # nothing recomputed inside the batch
    assert not tile_explorer.result.occupancy.fits
    assert "fits: NO" in tile_explorer.summary.value
    with tile_explorer.batch():
        c["hardware"].value = "edge_npu"
        c["block_q"].value = c["block_k"].value = 16
        c["head_dim"].value = 64
    r = tile_explorer.result
    assert r.occupancy.fits and r.occupancy.blocks_per_unit == 256 * 1024 // r.budget.total_bytes


def test_float8_budgets_one_byte_runs_the_problem_in_bfloat16(tile_explorer):
    tile_explorer.controls["dtype"].value = "float8_e4m3fn"
    r = tile_explorer.result
    assert r.budget.dtype == "float8_e4m3fn" and r.run_dtype == "bfloat16" and r.within_tolerance


def test_tile_size_twin_draws_the_same_numbers_as_the_widget():
    numbers = widgets.tile_size_numbers(32, 64, 128, "bfloat16", "a100_80gb", 8192)
    explorer = widgets.tile_size_explorer(32, 64, 128, "bfloat16", "a100_80gb", 8192)
    assert explorer.result.budget == numbers.budget and explorer.result.flash == numbers.flash
    assert explorer.result.summary() == numbers.summary()
    fig = widgets.tile_size_figure(32, 64, 128, "bfloat16", "a100_80gb", 8192)
    assert len(fig.axes) == 4  # budget, traffic, error map and its colour bar
    assert "does NOT fit" not in fig.axes[0].get_title()
    matplotlib.pyplot.close(fig)


# -- the roofline explorer ------------------------------------------------------------

def test_roofline_explorer_places_naive_and_flash_by_the_models(measurement):
    explorer = widgets.roofline_explorer(measurement=measurement)
    assert isinstance(explorer, ipywidgets.VBox)
    assert set(explorer.controls) == {"hardware", "seqlen", "head_dim", "dtype", "causal", "show"}
    r = explorer.result
    naive = iomodel.naive_io(4096, 4096, 64, "float16")
    assert r.traffic["naive"] == naive
    assert r.bounds["naive"] == roofline.time_bound(naive, "h100_sxm", "float16")
    assert r.here["naive"] == roofline.time_bound(naive, measurement, "float32")
    assert r.bounds["fa2"].flops_per_s > r.bounds["naive"].flops_per_s  # flash sits further right, higher


def test_roofline_explorer_controls_change_what_it_computes(measurement):
    explorer = widgets.roofline_explorer(measurement=measurement)
    c = explorer.controls
    text = explorer.summary.value
    c["hardware"].value = "l4"
    assert explorer.result.hardware == "l4" and "NVIDIA L4" in explorer.summary.value and text != explorer.summary.value
    full = explorer.result.traffic["fa2"]
    c["causal"].value = True
    assert explorer.result.traffic["fa2"].flops < 0.6 * full.flops
    assert explorer.result.traffic["naive"] == iomodel.naive_io(4096, 4096, 64, "float16")  # naive computes all of S
    c["show"].value = "naive"
    assert explorer.result.schedules() == ["naive"] and "flash" not in explorer.summary.value
    with explorer.batch():
        c["seqlen"].value = 65536
        c["head_dim"].value = 128
    assert explorer.result.traffic["naive"] == iomodel.naive_io(65536, 65536, 128, "float16", causal=True)


def test_this_machine_is_exp_bound_when_its_exp_is_slow(measurement):
    slow_exp = measure.Measurement(**{**measurement.__dict__, "exp_per_s": 1e8})
    r = widgets.roofline_numbers(seqlen=2048, head_dim=64, measurement=slow_exp)
    assert r.here["fa2"].limiter == "exp"
    assert r.here["fa2"].seconds == pytest.approx(2048 * 2048 / 1e8)


def test_roofline_twin_draws_both_machines_and_the_points(measurement):
    fig = widgets.roofline_figure("h200", 8192, 128, "bfloat16", measurement=measurement)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any("H200" in lab for lab in labels) and any("this machine" in lab for lab in labels)
    assert sum("on " in lab for lab in labels) == 4  # naive and flash, on the preset and here
    matplotlib.pyplot.close(fig)


def test_roofline_numbers_rejects_an_unknown_view(measurement):
    with pytest.raises(ValueError, match="show"):
        widgets.roofline_numbers(show="all", measurement=measurement)


def test_roofline_explorer_shows_l2_aware_and_two_level_bounds(measurement):
    r = widgets.roofline_numbers("h200", seqlen=8192, head_dim=128, dtype="float16", measurement=measurement)
    assert r.flash_levels == iomodel.levels(8192, 8192, 128, "float16", "h200", block_q=128, block_k=64)
    assert r.flash_hbm_bound == roofline.attention_bounds(r.flash_levels, "h200", "float16")["bound"]
    assert r.flash_hbm_bound.flops_per_s > r.bounds["fa2"].flops_per_s  # compulsory bytes: the higher, true roof
    assert "true bound" in r.summary() and "two-level" in r.summary()
    npu = widgets.roofline_numbers("edge_npu", measurement=measurement)
    assert not npu.flash_levels.kv_fits_l2  # no cache: its HBM traffic is the two-level count
    tile = widgets.tile_size_numbers(block_q=128, block_k=64, head_dim=128, hardware="h200", seqlen=8192)
    assert tile.flash_levels.hbm_bytes == tile.flash_levels.compulsory_bytes and "HBM for FA2" in tile.summary()


# -- what a stored notebook shows where the widget was never run ------------------------------

def _bundle(box):
    data = box._repr_mimebundle_()
    return data[0] if isinstance(data, tuple) else data


def test_every_explorer_carries_its_figure_as_a_png():
    """nbviewer, GitHub and a notebook opened before it runs show outputs only: a figure, not 'Explorer(children=...'."""
    import base64

    from course_lib.views import stepthrough
    from course_lib.views.tilemap import tile_map_explorer

    boxes = {"tile size": widgets.tile_size_explorer(), "tile map": tile_map_explorer(),
             "step-through": stepthrough.stepthrough_widget()}
    for name, box in boxes.items():
        data = _bundle(box)
        assert base64.b64decode(data["image/png"]) == box.image.value and box.image.value[:4] == b"\x89PNG", name
        assert "children=" not in data["text/plain"] and "run this cell in JupyterLab" in data["text/plain"], name
        assert "application/vnd.jupyter.widget-view+json" in data, name  # live in JupyterLab, as before


def test_a_tile_map_of_many_tiles_is_one_image():
    """1 x 1 tiles on 256 x 256 once drew 65,536 rectangles and locked the explorer for minutes."""
    from course_lib.views.tilemap import MAX_DRAWN_TILES, plot_tile_map

    fig = plot_tile_map(256, 256, 1, 1, causal=True)
    ax = fig.axes[0]
    assert len(ax.images) == 1 and len(ax.patches) == 0
    assert len(ax.lines) == 0 and "too many tiles" in ax.get_title()  # no 510 grid lines either
    fig = plot_tile_map(64, 64, 16, 16, causal=True)
    assert len(fig.axes[0].lines) == 2 * 3 and 4 <= MAX_DRAWN_TILES  # borders while they can be seen


def test_the_tile_map_explorer_redraws_on_release_not_on_drag():
    from course_lib.views.tilemap import tile_map_explorer

    box = tile_map_explorer()
    sliders = [c for c in box.controls.values() if hasattr(c, "continuous_update")]
    assert sliders and all(c.continuous_update is False for c in sliders)
