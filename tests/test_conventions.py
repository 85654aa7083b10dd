"""Other libraries' conventions beside the course's (course_lib.core.conventions):
FlashAttention-2's causal ALiBi lse, the lse of a fully masked row in each
library, and FA2's rewriting of windows and head dims."""
import math

import numpy as np
import pytest

import course_lib
from course_lib.core import conventions
from course_lib.core.options import AttentionOptions

from conftest import make_qkv


def test_fa2_causal_alibi_keeps_the_output_and_shifts_the_lse():
    rng = np.random.default_rng(5)
    nq, nk, slopes = 7, 12, np.array([0.25, 0.5])
    q, k, v = make_qkv(rng, 1, 2, 2, nq, nk, 8, 8)
    ours, lse = course_lib.attention(q, k, v, causal=True, alibi_slopes=slopes, return_lse=True)
    # FA2's kernel form: scores + slope * j on the keys a row sees
    i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]
    s = np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(8) + slopes[None, :, None, None] * j
    s = np.where(j <= i + nk - nq, s, -np.inf)
    fa2_lse = np.log(np.exp(s).sum(-1))
    fa2_out = np.einsum("bhij,bhjd->bhid", np.exp(s - fa2_lse[..., None]), v)
    np.testing.assert_allclose(fa2_out, ours, atol=1e-12)  # identical outputs
    np.testing.assert_allclose(conventions.fa2_causal_alibi_lse(lse, slopes, nq, nk), fa2_lse, atol=1e-12)
    assert not np.allclose(lse, fa2_lse)  # the lse really differs


def test_masked_row_lse_and_fa2_window_and_head_dim_conventions():
    assert conventions.FULLY_MASKED_LSE["course_lib"] == conventions.FULLY_MASKED_LSE["FlashAttention-3"] == -math.inf
    assert conventions.FULLY_MASKED_LSE["FlashAttention-2 kernel"] == math.inf
    assert conventions.FULLY_MASKED_LSE["PyTorch CPU flash kernel"] == 0.0
    _, lse = course_lib.attention(*make_qkv(np.random.default_rng(6), 1, 1, 1, 9, 4, 4, 4), causal=True,
                                  return_lse=True)
    assert np.isneginf(lse[0, 0, :5]).all()  # ours: -inf
    # FA2 rewrites a side >= seqlen_k to unbounded: no change for Nq <= Nk, a different mask for Nq > Nk
    for nq, nk, differs in ((8, 12, False), (12, 8, True)):
        window = (nk + 2, nk)
        rewritten = conventions.fa2_window(window, nq, nk)
        assert rewritten == (-1, -1)
        ours = AttentionOptions(1.0, window_size=window).mask(nq, nk)
        theirs = AttentionOptions(1.0, window_size=rewritten).mask(nq, nk)
        rows, cols = np.arange(nq), np.arange(nk)
        assert (not np.array_equal(ours.visible(rows, cols), theirs.visible(rows, cols))) == differs
    assert conventions.fa2_window((3, 5), 12, 8) == (3, 5)
    assert [conventions.fa2_head_dim(d) for d in (1, 32, 33, 80, 128, 160, 200, 256)] == [32, 32, 64, 96, 128, 192, 256, 256]
    with pytest.raises(ValueError, match="head_dim"):
        conventions.fa2_head_dim(257)
