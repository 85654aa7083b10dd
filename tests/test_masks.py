"""The mask module: element visibility, tile classification, the tile map,
and the varlen packing helpers."""
import html

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.core.masks import EMPTY, FULL, PARTIAL, MaskSpec
from course_lib.core.varlen import cu_seqlens, pack, pad, unpack
from course_lib.views.tilemap import plot_tile_map, tile_counts, tile_map_explorer


def brute_visible(nq, nk, causal, align, window):
    """Visibility written straight from the definition, one pair at a time."""
    offset = nk - nq if align == "bottom_right" else 0
    left, right = window
    if causal:
        right = 0
    seen = np.zeros((nq, nk), bool)
    for i in range(nq):
        for j in range(nk):
            seen[i, j] = (left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right)
    return seen


masks = st.builds(
    MaskSpec,
    seqlen_q=st.integers(1, 40), seqlen_k=st.integers(1, 40), causal=st.booleans(),
    causal_align=st.sampled_from(["bottom_right", "top_left"]),
    window_size=st.tuples(st.integers(-1, 12), st.integers(-1, 12)))


@settings(max_examples=150, deadline=None)
@given(mask=masks)
def test_visible_matches_the_definition(mask):
    expected = brute_visible(mask.seqlen_q, mask.seqlen_k, mask.causal, mask.causal_align, mask.window_size)
    assert np.array_equal(mask.visible(np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)), expected)


@settings(max_examples=150, deadline=None)
@given(mask=masks, block_q=st.integers(1, 17), block_k=st.integers(1, 17))
def test_tile_kind_agrees_with_the_elements_it_covers(mask, block_q, block_k):
    seen = brute_visible(mask.seqlen_q, mask.seqlen_k, mask.causal, mask.causal_align, mask.window_size)
    kinds = mask.tile_map(block_q, block_k)
    for i in range(kinds.shape[0]):
        for j in range(kinds.shape[1]):
            tile = seen[i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k]
            expected = FULL if tile.all() else EMPTY if not tile.any() else PARTIAL
            assert kinds[i, j] == expected, (i, j)


def test_no_mask_makes_every_tile_full():
    counts = tile_counts(MaskSpec(100, 37), 16, 16)
    assert (counts.full, counts.partial, counts.empty) == (21, 0, 0)


def test_causal_at_equal_lengths_computes_about_half_the_tiles():
    counts = tile_counts(MaskSpec(1024, 1024, causal=True), 64, 64)
    # 16 x 16 tiles: the diagonal is partial, the 120 tiles below it full, the 120 above empty
    assert (counts.full, counts.partial, counts.empty) == (120, 16, 120)
    assert counts.work_fraction == pytest.approx(136 / 256)


def test_alignments_run_different_tiles_when_nq_differs_from_nk():
    bottom = MaskSpec(16, 64, causal=True).tile_map(16, 16)
    top = MaskSpec(16, 64, causal=True, causal_align="top_left").tile_map(16, 16)
    assert list(bottom[0]) == [FULL, FULL, FULL, PARTIAL]
    assert list(top[0]) == [PARTIAL, EMPTY, EMPTY, EMPTY]


def test_alibi_bias_is_minus_slope_times_the_diagonal_distance():
    mask = MaskSpec(2, 5)
    bias = mask.alibi_bias(0.5, [0, 1], range(5))
    assert np.array_equal(bias, -0.5 * np.array([[3, 2, 1, 0, 1], [4, 3, 2, 1, 0]]))


def test_tile_map_explorer_recounts_when_a_control_moves():
    box = tile_map_explorer(seqlen_q=64, seqlen_k=64, block_q=16, block_k=16)
    assert (box.counts.full, box.counts.partial, box.counts.empty) == (6, 4, 6)
    box.controls["causal"].value = False
    assert (box.counts.full, box.counts.partial, box.counts.empty) == (16, 0, 0)
    box.controls["left"].value = 8
    assert box.counts.empty > 0 and box.counts.partial > 0
    assert html.escape(str(box.counts)) in box.children[1].value


def test_static_tile_map_titles_the_counts():
    fig = plot_tile_map(40, 56, 16, 16, causal=True)
    assert "9 computed" in fig.axes[0].get_title()


def test_pack_and_unpack_round_trip_with_empty_sequences():
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((n, 2, 3)) for n in (3, 0, 5)]
    packed, cu = pack(seqs)
    assert packed.shape == (8, 2, 3) and cu.tolist() == [0, 3, 3, 8] and cu.dtype == np.int32
    for a, b in zip(unpack(packed, cu), seqs):
        assert np.array_equal(a, b)
    dense, valid = pad(seqs)
    assert dense.shape == (3, 2, 5, 3) and valid.sum(axis=1).tolist() == [3, 0, 5]


def test_cu_seqlens_rejects_negative_lengths():
    with pytest.raises(ValueError, match="lengths"):
        cu_seqlens([2, -1])
