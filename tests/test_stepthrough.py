"""The step-through of the online softmax (course_lib.views.stepthrough): trace, figure, widget."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from course_lib.views import stepthrough


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def direct(S, v):
    lse = np.logaddexp.reduce(S, axis=-1, initial=-np.inf)
    with np.errstate(invalid="ignore"):
        p = np.nan_to_num(np.exp(S - lse[:, None]), nan=0.0)
    return p @ v, lse


def test_the_trace_ends_at_the_exact_softmax_output():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((5, 6)), rng.standard_normal((29, 6)), rng.standard_normal((29, 3))
    trace = stepthrough.trace_query_tile(q, k, v, block_k=8, softmax_scale=0.7)
    out, lse = direct(0.7 * q @ k.T, v)
    last = trace.steps[-1]
    np.testing.assert_allclose(last.O / last.l[:, None], out, rtol=1e-12)
    np.testing.assert_allclose(trace.out, out, rtol=1e-12)
    np.testing.assert_allclose(trace.lse, lse, rtol=1e-12)


def test_one_step_per_kv_tile_with_a_tail_and_m_never_decreases():
    rng = np.random.default_rng(1)
    trace = stepthrough.trace_query_tile(rng.standard_normal((3, 5)), rng.standard_normal((23, 5)),
                                         rng.standard_normal((23, 2)), block_k=6)
    assert trace.Tc == 4 and [s.cols for s in trace.steps] == [(0, 6), (6, 12), (12, 18), (18, 23)]
    ms = np.array([s.m for s in trace.steps])
    assert np.all(np.diff(ms, axis=0) >= 0)
    for s in trace.steps:  # m is the max of the scores seen so far
        np.testing.assert_array_equal(s.m, trace.S[:, :s.cols[1]].max(axis=1))


def test_the_demo_has_a_rescale_a_learner_can_see():
    trace = stepthrough.demo_trace()
    alphas = np.array([s.alpha for s in trace.steps[1:]])
    assert np.any(alphas < 0.1)  # a late tile raises a row's max a lot


def test_a_fully_masked_row_stays_empty_without_nan():
    rng = np.random.default_rng(2)
    visible = np.ones((3, 10), dtype=bool)
    visible[1] = False
    trace = stepthrough.trace_query_tile(rng.standard_normal((3, 4)), rng.standard_normal((10, 4)),
                                         rng.standard_normal((10, 4)), block_k=4, visible=visible)
    assert np.array_equal(trace.out[1], np.zeros(4)) and np.isneginf(trace.lse[1])
    for s in trace.steps:
        assert not np.isnan(s.O).any() and not np.isnan(s.l).any()
    stepthrough.draw_step(trace, trace.Tc)  # draws without error


def test_draw_step_draws_scores_and_the_running_quantities():
    trace = stepthrough.demo_trace()
    fig = stepthrough.draw_step(trace, 3)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 4
    assert "tile 3 of 5" in titles[0]
    assert any("running max m" in t for t in titles) and any("running sum l" in t for t in titles)
    # the m panel shows one line per row, up to the current step
    m_lines = [line for line in fig.axes[1].get_lines() if len(line.get_xdata()) > 2]
    assert len(m_lines) == 4 and all(len(line.get_xdata()) == 3 for line in m_lines)


@pytest.mark.parametrize("step", [0, 6])
def test_draw_step_refuses_a_step_outside_the_tiles(step):
    with pytest.raises(ValueError, match="step must be between 1 and 5"):
        stepthrough.draw_step(stepthrough.demo_trace(), step)


def test_widget_slides_over_every_step_like_the_static_figure():
    trace = stepthrough.demo_trace()
    widget = stepthrough.stepthrough_widget(trace)
    slider = widget.slider
    assert (slider.min, slider.max, slider.value) == (1, trace.Tc, 1)
    for step in range(1, trace.Tc + 1):
        slider.value = step
        assert widget.image.value[:8] == b"\x89PNG\r\n\x1a\n"
        titles = [ax.get_title() for ax in widget.figure.axes]
        static = [ax.get_title() for ax in stepthrough.draw_step(trace, step).axes]
        assert titles == static and f"tile {step} of" in titles[0]


def test_the_widget_draws_nothing_into_pyplot():
    plt.close("all")
    stepthrough.stepthrough_widget(stepthrough.demo_trace()).slider.value = 3
    assert plt.get_fignums() == []
