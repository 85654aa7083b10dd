"""The shape-bucket matrix: every impl on this machine, against the float64
reference under the course's tolerance rule, over tails, Nq != Nk, head dims
{1, 16, 59, 64, 111, 128}, every mask type, MHA / GQA / MQA and every dtype.

The full product of head dim x mask x dtype runs for each impl; the shape
bucket and head layout rotate through it so that every bucket meets every
mask and every dtype."""
import itertools

import ml_dtypes
import numpy as np
import pytest

import course_lib
from course_lib import checks, kernels

from conftest import make_qkv

HEAD_DIMS = [1, 16, 59, 64, 111, 128]
DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
# (Nq, Nk, block_q, block_k): tails, Nq > Nk, Nq < Nk, Nk smaller than one tile, decode
BUCKETS = {
    "tails": (37, 53, 16, 16),
    "nq_gt_nk": (45, 19, 8, 16),
    "nq_lt_nk": (9, 70, 4, 32),
    "nk_below_one_tile": (21, 5, 16, 16),
    "decode": (1, 33, 16, 8),
    "exact_tiles": (32, 32, 16, 16),
}
HEADS = {"mha": (4, 4), "gqa": (6, 2), "mqa": (3, 1)}
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "causal_top_left": {"causal": True, "causal_align": "top_left"},
    "window": {"window_size": (6, 3)},
    "causal_window": {"causal": True, "window_size": (5, -1)},
    "softcap": {"softcap": 1.5, "causal": True},
    "alibi": {"alibi": True},
    # a window that misses every key for some rows: fully masked rows
    "empty_rows": {"window_size": (0, 0), "causal_align": "top_left"},
}
# The CUDA impls run in a simulator here, a Python thread per CUDA thread, and take float32 only:
# they have their own small loops (tests/test_flash_numba_cuda.py, tests/test_cuda_steps.py).
IMPLS = [name for name in course_lib.available_impls() if not kernels.IMPLS[name].cuda]


def cases():
    rotation = itertools.cycle(itertools.product(BUCKETS, HEADS))
    for d, mask, dtype in itertools.product(HEAD_DIMS, MASKS, DTYPES):
        bucket, heads = next(rotation)
        yield pytest.param(d, mask, dtype, bucket, heads,
                           id=f"D{d}-{mask}-{np.dtype(dtype).name}-{bucket}-{heads}")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("head_dim,mask,dtype,bucket,heads", list(cases()))
def test_impl_matches_reference(impl, head_dim, mask, dtype, bucket, heads):
    nq, nk, block_q, block_k = BUCKETS[bucket]
    h, hk = HEADS[heads]
    q, k, v = make_qkv(head_dim * 1000 + nq * 10 + nk, 2, h, hk, nq, nk, head_dim, dtype=dtype)
    options = dict(MASKS[mask])
    if options.pop("alibi", False):
        options["alibi_slopes"] = np.linspace(0.02, 0.5, 2 * h).reshape(2, h)
    out, lse = course_lib.attention(q, k, v, impl=impl, block_q=block_q, block_k=block_k,
                                    return_lse=True, **options)
    checks.check_attention(out, q, k, v, lse=lse, block_q=block_q, block_k=block_k, **options)
    if mask == "empty_rows" and nq > nk:
        assert np.isneginf(lse[:, :, nk:]).all() and (out[:, :, nk:] == 0).all()
