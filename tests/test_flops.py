"""The one FLOP convention: 2 (D + Dv) FLOPs per (query, key) pair the mask lets through."""
import numpy as np
import pytest

from course_lib.core.flops import attention_flops, visible_pairs
from course_lib.core.masks import MaskSpec

MASKS = [dict(), dict(causal=True), dict(causal=True, causal_align="top_left"), dict(window_size=(5, 3))]


def test_flops_count_visible_pairs_so_decode_counts_every_key():
    assert attention_flops(2, 3, 100, 300, 64) == 4 * 2 * 3 * 100 * 300 * 64
    n = 512
    assert attention_flops(1, 1, n, n, 64, causal=True) == 4 * 64 * n * (n + 1) // 2  # about half
    decode = attention_flops(1, 1, 1, 4096, 128, causal=True)  # Nq = 1, bottom-right: sees all keys
    assert decode == attention_flops(1, 1, 1, 4096, 128) == 4 * 4096 * 128
    top_left = attention_flops(1, 1, 1, 4096, 128, causal=True, causal_align="top_left")
    assert top_left == 4 * 1 * 128  # top-left: the one query sees key 0 only
    window = attention_flops(1, 1, 64, 64, 8, window_size=(3, 0))
    assert window == 4 * 8 * sum(min(i, 3) + 1 for i in range(64))
    assert attention_flops(1, 1, 10, 10, 8, head_dim_v=4) == 2 * 10 * 10 * (8 + 4)


@pytest.mark.parametrize("mask", MASKS + [dict(window_size=(0, 0))], ids=str)
def test_visible_pairs_equal_the_reference_masks_count(mask):
    spec = MaskSpec(37, 53, **mask)
    expected = int(spec.visible(np.arange(37), np.arange(53)).sum())
    assert visible_pairs(37, 53, **mask) == expected


# -- the third level: L2 ---------------------------------------------------------------

H200 = dict(batch=2, heads=16, block_q=128, block_k=64)
