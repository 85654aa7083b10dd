"""flash_numpy skips what the tile map says it may skip, and masks only what it must.

The kernel computes every (batch, head) pair of a tile at once (the leading
axes of its numpy tiles), so its TileStats count each (Q tile, K tile) pair
once, whatever B and H: they must equal ``tilemap.tile_counts`` exactly."""
from functools import partial

import numpy as np
import pytest

from course_lib import api
from course_lib.core.masks import MaskSpec
from course_lib.core.options import AttentionOptions, call_forward
from course_lib.kernels import flash_numpy
from course_lib.views.tilemap import tile_counts

from conftest import make_qkv

CASES = {
    # name: (Nq, Nk, block_q, block_k, options)
    "causal_square": (64, 64, 16, 16, dict(causal=True)),
    "causal_tails": (45, 45, 16, 8, dict(causal=True)),
    "causal_bottom_right_nq_lt_nk": (24, 70, 8, 16, dict(causal=True)),
    "causal_top_left_nq_lt_nk": (24, 70, 8, 16, dict(causal=True, causal_align="top_left")),
    "causal_bottom_right_nq_gt_nk": (70, 24, 16, 8, dict(causal=True)),
    "causal_top_left_nq_gt_nk": (70, 24, 16, 8, dict(causal=True, causal_align="top_left")),
    "decode": (1, 50, 16, 16, dict(causal=True)),
    "window": (64, 64, 8, 8, dict(window_size=(10, 3))),
    "causal_window": (50, 61, 8, 16, dict(causal=True, window_size=(12, -1))),
    "window_top_left": (33, 80, 8, 8, dict(window_size=(4, 4), causal_align="top_left")),
    "no_mask": (37, 53, 16, 16, {}),
    "nk_below_one_tile": (21, 5, 16, 16, dict(causal=True)),
}


def run_with_stats(loop_order, nq, nk, block_q, block_k, options, batch=2, heads=3, heads_k=1, d=8):
    stats = flash_numpy.TileStats()
    forward = partial(flash_numpy.flash_forward, loop_order=loop_order, stats=stats)
    out = call_forward(forward, *make_qkv(0, batch, heads, heads_k, nq, nk, d), block_q=block_q, block_k=block_k,
                       **options)
    return stats, out


def expected_counts(nq, nk, block_q, block_k, options):
    mask = MaskSpec(nq, nk, options.get("causal", False), options.get("causal_align", "bottom_right"),
                    options.get("window_size", (-1, -1)))
    return tile_counts(mask, block_q, block_k)


@pytest.mark.parametrize("loop_order", flash_numpy.LOOP_ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_computed_and_skipped_tiles_equal_the_tile_map(loop_order, case):
    nq, nk, block_q, block_k, options = CASES[case]
    stats, _ = run_with_stats(loop_order, nq, nk, block_q, block_k, options)
    counts = expected_counts(nq, nk, block_q, block_k, options)
    assert (stats.computed, stats.skipped) == (counts.computed, counts.empty)


@pytest.mark.parametrize("loop_order", flash_numpy.LOOP_ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_only_partial_tiles_are_masked(loop_order, case):
    nq, nk, block_q, block_k, options = CASES[case]
    stats, _ = run_with_stats(loop_order, nq, nk, block_q, block_k, options)
    assert stats.masked == expected_counts(nq, nk, block_q, block_k, options).partial


@pytest.mark.parametrize("batch,heads,heads_k", [(1, 1, 1), (3, 4, 2), (2, 6, 1)])
def test_tile_counts_do_not_scale_with_batch_or_heads(batch, heads, heads_k):
    # every (batch, head) of a tile is one numpy operation: one tile, counted once
    nq, nk, block_q, block_k, options = CASES["causal_tails"]
    stats, _ = run_with_stats("fa2", nq, nk, block_q, block_k, options, batch=batch, heads=heads, heads_k=heads_k)
    counts = expected_counts(nq, nk, block_q, block_k, options)
    assert (stats.computed, stats.skipped, stats.masked) == (counts.computed, counts.empty, counts.partial)


@pytest.mark.parametrize("n,block", [(256, 16), (512, 64), (1000, 32)])
def test_causal_at_equal_lengths_computes_about_half_the_tiles(n, block):
    full, _ = run_with_stats("fa2", n, n, block, block, {}, batch=1, heads=1, d=4)
    causal, _ = run_with_stats("fa2", n, n, block, block, dict(causal=True), batch=1, heads=1, d=4)
    tiles = -(-n // block)
    assert full.computed == tiles * tiles and full.skipped == 0
    assert causal.computed == tiles * (tiles + 1) // 2  # the diagonal and everything below it
    assert 0.5 <= causal.computed / full.computed <= 0.5 + 1 / tiles


def test_skipped_tiles_are_not_loaded_so_causal_moves_less():
    full, _ = run_with_stats("fa2", 128, 128, 16, 16, {})
    causal, _ = run_with_stats("fa2", 128, 128, 16, 16, dict(causal=True))
    assert causal.hbm_read < full.hbm_read
    assert causal.hbm_write == full.hbm_write  # every output row is still written once


class CountingMask(MaskSpec):
    """A MaskSpec that remembers which tiles asked for the elementwise mask."""

    def visible(self, rows, cols):
        rows, cols = np.asarray(rows), np.asarray(cols)
        if rows.size and cols.size:
            self.calls.append((int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1))
        return super().visible(rows, cols)


@pytest.mark.parametrize("loop_order", flash_numpy.LOOP_ORDERS)
@pytest.mark.parametrize("case", ["causal_tails", "causal_window", "window_top_left", "no_mask"])
def test_full_tiles_get_no_elementwise_mask(loop_order, case):
    nq, nk, block_q, block_k, options = CASES[case]
    q, k, v = make_qkv(0, 2, 3, 1, nq, nk, 8)
    opts = AttentionOptions(softmax_scale=0.3, block_q=block_q, block_k=block_k,
                                **{key: value for key, value in options.items()})
    spec = opts.mask(nq, nk)
    mask = CountingMask(spec.seqlen_q, spec.seqlen_k, spec.causal, spec.causal_align, spec.window_size)
    object.__setattr__(mask, "calls", [])
    flash_numpy.flash_forward(q, k, v, opts, mask, loop_order)
    masked_tiles = set(mask.calls)
    partial_tiles = {(r0, min(r0 + block_q, nq), c0, min(c0 + block_k, nk))
                     for r0 in range(0, nq, block_q) for c0 in range(0, nk, block_k)
                     if spec.tile_kind(r0, min(r0 + block_q, nq), c0, min(c0 + block_k, nk)) == "partial"}
    assert masked_tiles == partial_tiles


def test_skipping_does_not_change_the_answer():
    # a kernel that skipped a tile someone could see would be wrong on exactly those rows
    for case, (nq, nk, block_q, block_k, options) in CASES.items():
        _, out = run_with_stats("fa2", nq, nk, block_q, block_k, options)
        reference = api.attention(*make_qkv(0, 2, 3, 1, nq, nk, 8), **options)
        np.testing.assert_allclose(out, reference, rtol=1e-9, atol=1e-10, err_msg=case)


def test_run_with_stats_reports_the_tiles_of_that_call():
    nq, nk, block_q, block_k, options = CASES["causal_bottom_right_nq_lt_nk"]
    _, _, stats = flash_numpy.run_with_stats(*make_qkv(0, 2, 3, 1, nq, nk, 8), block_q=block_q, block_k=block_k,
                                             **options)
    counts = expected_counts(nq, nk, block_q, block_k, options)
    assert (stats.computed, stats.skipped, stats.masked) == (counts.computed, counts.empty, counts.partial)
    assert not hasattr(flash_numpy, "last_stats")  # no module-level state: each call owns its counts
