"""Rules every impl on this machine must keep, beyond matching the reference
(tests/test_matrix.py): packed varlen batches (each sequence masked and ALiBi-
biased on its own lengths), untouched (even read-only) inputs, and a NaN that
stays in its own query row."""
import numpy as np
import pytest

import course_lib
from course_lib import checks, kernels
from course_lib.core.varlen import pack, unpack

from conftest import make_qkv

# The CUDA impls run in a simulator here, a Python thread per CUDA thread, and take float32 only:
# they have their own small loops (tests/test_flash_numba_cuda.py, tests/test_cuda_steps.py).
IMPLS = [name for name in course_lib.available_impls() if not kernels.IMPLS[name].cuda]


def test_the_cpu_impls_are_all_available():
    # an impl whose module fails to import would silently drop out of every matrix
    assert {"reference", "naive", "flash_numpy", "flash_numpy_fa1", "flash_numba_cpu"} <= set(IMPLS)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_equals_each_sequence_alone_with_empty_sequences(impl, causal):
    rng = np.random.default_rng(11)
    lens_q, lens_k = [5, 0, 17, 1, 9], [3, 4, 17, 0, 30]
    q_seqs = [rng.standard_normal((n, 4, 59)).astype(np.float32) for n in lens_q]
    k_seqs = [rng.standard_normal((n, 2, 59)).astype(np.float32) for n in lens_k]
    v_seqs = [rng.standard_normal((n, 2, 7)).astype(np.float32) for n in lens_k]
    slopes = rng.uniform(0.1, 0.5, (5, 4)) if causal else None  # causal with ALiBi: both on each sequence's lengths
    (q, cu_q), (k, cu_k), (v, _) = pack(q_seqs), pack(k_seqs), pack(v_seqs)
    out, lse = course_lib.attention_varlen(q, k, v, cu_q, cu_k, impl=impl, causal=causal, alibi_slopes=slopes,
                                           block_q=8, block_k=8, return_lse=True)
    assert out.shape == (q.shape[0], 4, 7) and lse.shape == (4, q.shape[0])
    for b, (qs, ks, vs, ob) in enumerate(zip(q_seqs, k_seqs, v_seqs, unpack(out, cu_q))):
        dense = [x.transpose(1, 0, 2)[None] for x in (qs, ks, vs)]
        checks.check_attention(ob.transpose(1, 0, 2)[None], *dense, causal=causal,
                               alibi_slopes=None if slopes is None else slopes[b:b + 1],
                               lse=lse[None, :, cu_q[b]:cu_q[b + 1]], name=f"{impl} varlen sequence {b}")


@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_inputs_are_accepted_and_left_untouched(impl):
    q, k, v = checks.readonly(*make_qkv(12, 2, 4, 2, 37, 45, 16, 8))
    slopes = checks.readonly(np.array([0.1, 0.2, 0.3, 0.4]))
    before = [x.copy() for x in (q, k, v, slopes)]
    course_lib.attention(q, k, v, impl=impl, causal=True, softcap=3.0, alibi_slopes=slopes,
                         block_q=16, block_k=16)
    assert all(np.array_equal(x, y) for x, y in zip((q, k, v, slopes), before))


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_one_query_row_changes_only_that_row(impl):
    q, k, v = make_qkv(13, 1, 2, 2, 40, 40, 16, 8)
    clean = course_lib.attention(q, k, v, impl=impl, causal=True, block_q=16, block_k=16)
    q[0, 1, 21, 3] = np.nan
    out = course_lib.attention(q, k, v, impl=impl, causal=True, block_q=16, block_k=16)
    assert np.isnan(out[0, 1, 21]).all()
    rows = np.ones(out.shape[:3], bool)
    rows[0, 1, 21] = False
    assert np.array_equal(out[rows], clean[rows])
