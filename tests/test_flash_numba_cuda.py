"""impl flash_numba_cuda (chapter 09), in the simulator: its own shape-bucket
matrix against the float64 reference (tails, Nq != Nk, MHA / GQA / MQA, every
mask kind, lse, fully masked rows), bad input, and the rule that without a GPU
every launch also passes cudacheck.  Shapes are small: each CUDA thread is a
Python thread here.  The large shapes ran on an H200 (benchmarks/gpu_attention.py,
notebooks/records/gpu_attention.jsonl)."""
import itertools
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32

import course_lib
from course_lib import checks
from course_lib.core.options import call_forward
from course_lib.kernels import flash_numba_cuda as fnc

from conftest import REPO, make_qkv

# (Nq, Nk, block_q, block_k): tails, Nq > Nk, Nq < Nk, Nk below one tile, decode, exact tiles
BUCKETS = {
    "tails": (21, 27, 8, 8),
    "nq_gt_nk": (19, 9, 8, 4),
    "nq_lt_nk": (5, 30, 4, 16),
    "nk_below_one_tile": (11, 3, 8, 8),
    "decode": (1, 17, 8, 4),
    "exact_tiles": (16, 16, 8, 8),
}
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (3, 1)}
HEAD_DIMS = [1, 7, 16]
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "causal_top_left": {"causal": True, "causal_align": "top_left"},
    "window": {"window_size": (4, 2)},
    "causal_window": {"causal": True, "window_size": (3, -1)},
    "softcap": {"softcap": 1.5, "causal": True},
    "alibi": {"alibi": True},
    "empty_rows": {"window_size": (0, 0), "causal_align": "top_left"},
}


def cases():
    rotation = itertools.cycle(itertools.product(HEADS, HEAD_DIMS))
    for bucket, mask in itertools.product(BUCKETS, MASKS):
        heads, d = next(rotation)
        yield pytest.param(bucket, mask, heads, d, id=f"{bucket}-{mask}-{heads}-D{d}")


def test_available_without_a_gpu_and_says_where_it_runs():
    assert "flash_numba_cuda" in course_lib.available_impls()
    assert fnc.where() == ("numba simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else
                           "gpu" if cuda.is_available() else "cudacheck")


@pytest.mark.parametrize("bucket,mask,heads,head_dim", list(cases()))
def test_flash_numba_cuda_matches_the_reference(bucket, mask, heads, head_dim):
    nq, nk, block_q, block_k = BUCKETS[bucket]
    h, hk = HEADS[heads]
    q, k, v = make_qkv(nq * 100 + nk + head_dim, 1, h, hk, nq, nk, head_dim, head_dim + 1, dtype=np.float32)
    options = dict(MASKS[mask])
    if options.pop("alibi", False):
        options["alibi_slopes"] = np.linspace(0.05, 0.6, h)
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cuda", block_q=block_q, block_k=block_k,
                                    return_lse=True, **options)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    checks.check_attention(out, q, k, v, lse=lse, block_q=block_q, **options)
    if mask == "empty_rows" and nq > nk:
        assert np.isneginf(lse[:, :, nk:]).all() and (out[:, :, nk:] == 0).all()


def test_rows_that_see_no_key_give_zero_and_minus_inf_lse():
    q, k, v = make_qkv(0, 1, 2, 1, 12, 10, 4, dtype=np.float32)
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cuda", window_size=(0, 0),
                                    causal_align="top_left", block_q=4, block_k=4, return_lse=True)
    assert np.isneginf(lse[:, :, 10:]).all() and (out[:, :, 10:] == 0).all()
    assert np.isfinite(lse[:, :, :10]).all() and not np.isnan(out).any()


def test_default_tiles_and_head_dim_256_match_the_reference():
    q, k, v = make_qkv(0, 1, 2, 1, 9, 13, 256, 24, dtype=np.float32)
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cuda", causal=True, return_lse=True)
    checks.check_attention(out, q, k, v, lse=lse, causal=True)


def test_a_nan_in_one_query_row_changes_only_that_row():
    q, k, v = make_qkv(0, 1, 2, 2, 10, 9, 4, dtype=np.float32)
    q[0, 1, 3, 2] = np.nan
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cuda", block_q=4, block_k=4, return_lse=True)
    assert np.isnan(out[0, 1, 3]).all() and np.isnan(lse[0, 1, 3])
    bad = np.zeros(out.shape[:3], bool)
    bad[0, 1, 3] = True
    assert not np.isnan(out[~bad]).any() and not np.isnan(lse[~bad]).any()


def test_varlen_and_read_only_inputs():
    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 5, 5, 12]), np.array([0, 7, 9, 9])
    q = rng.standard_normal((12, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((9, 1, 8)).astype(np.float32) for _ in range(2))
    for x in (q, k, v):
        x.setflags(write=False)
    got = course_lib.attention_varlen(q, k, v, cu_q, cu_k, impl="flash_numba_cuda", causal=True, block_q=4)
    want = course_lib.attention_varlen(q, k, v, cu_q, cu_k, impl="reference", causal=True)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    assert (got[7:] == 0).all()  # the third sequence has no keys


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float16, ml_dtypes.bfloat16])
def test_dtypes_other_than_float32_are_refused_with_a_type_error(dtype):
    q, k, v = make_qkv(0, 1, 1, 1, 4, 4, 4, dtype=dtype)
    with pytest.raises(TypeError, match=rf"float32 only.*{np.dtype(dtype).name}.*astype\(np.float32\)"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda")


def test_more_than_1024_threads_are_refused_naming_block_q():
    q, k, v = make_qkv(0, 1, 1, 1, 4, 4, 4, dtype=np.float32)
    with pytest.raises(ValueError, match="block_q .*1024, got 2048"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda", block_q=2048)


def test_shared_memory_overflow_is_refused_naming_block_k():
    q, k, v = make_qkv(0, 1, 1, 1, 4, 4, 128, dtype=np.float32)
    with pytest.raises(ValueError, match=r"block_k=64 with head dims 128 \+ 128 needs 65536 bytes.*block_k <= 48"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda", block_k=64)


def test_the_simulator_refuses_too_large_shapes_and_says_so():
    q, k, v = make_qkv(0, 1, 2, 2, 512, 512, 16, dtype=np.float32)
    with pytest.raises(ValueError, match=r"takes only small problems.*above 2000000 \(about \d+ s of .* on the "
                                         r"course's machine\); shrink the shapes.*FLASH_SIM_MAX_WORK=16777216"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda")


def test_a_caller_raises_the_simulators_limit_by_environment(monkeypatch):
    q, k, v = make_qkv(0, 1, 1, 1, 8, 8, 4, dtype=np.float32)
    monkeypatch.setenv("FLASH_SIM_MAX_WORK", "100")
    with pytest.raises(ValueError, match=r"above 100 \(about 0 s"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda")
    monkeypatch.setenv("FLASH_SIM_MAX_WORK", "512")
    assert fnc.sim_max_work() == 512
    course_lib.attention(q, k, v, impl="flash_numba_cuda")   # 8 * 8 * 8 = 512: just within
    monkeypatch.setenv("FLASH_SIM_MAX_WORK", "lots")
    with pytest.raises(ValueError, match="FLASH_SIM_MAX_WORK='lots': .* an integer"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda")


def test_bad_input_is_caught_before_the_kernel_as_for_every_impl():
    q, k, v = make_qkv(0, 1, 2, 1, 4, 4, 4, dtype=np.float32)
    with pytest.raises(ValueError, match="q must be 4-D"):
        course_lib.attention(q[0], k, v, impl="flash_numba_cuda")
    with pytest.raises(ValueError, match="window_size"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda", window_size=(-2, 0))


# -- every launch without a GPU is checked --------------------------------------------------

def test_the_kernel_passes_cudacheck_with_tails_gqa_and_causal():
    from course_lib import cudacheck
    q, k, v = make_qkv(0, 1, 4, 2, 13, 11, 5, dtype=np.float32)
    got = {}

    def grab(q, k, v, opts, mask):
        got["plan"] = fnc.plan(q, k, v, opts, mask)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v, causal=True, block_q=8, block_k=4)
    p = got["plan"]
    out, lse = np.zeros(p.out_shape, np.float32), np.zeros(p.out_shape[:3], np.float32)
    report = cudacheck.check(p.kernel, p.griddim, p.blockdim, q, k, v, *p.args, out, lse)
    assert report.ok, str(report)
    assert report.traffic["global writes"] == out.size + lse.size  # O and lse written once each


@cuda.jit
def racy_kernel(q, k, v, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right, out, lse):
    """Writes every row's output from one shared slot without a barrier: a race."""
    slot = cuda.shared.array(1, float32)
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    slot[0] = float32(i)
    if i < q.shape[2]:
        lse[0, 0, i] = slot[0]


def test_a_racy_kernel_is_refused_with_cudacheck_s_message(monkeypatch):
    if fnc.where() != "cudacheck":
        pytest.skip("only the cudacheck runner checks launches")
    monkeypatch.setattr(fnc, "make_kernel", lambda Bc, D, Dv, exp2=False: racy_kernel)
    q, k, v = make_qkv(0, 1, 1, 1, 8, 8, 2, dtype=np.float32)
    with pytest.raises(RuntimeError, match=r"(?s)failed its check.*race.*shared array `slot`"):
        course_lib.attention(q, k, v, impl="flash_numba_cuda", block_q=8)


def test_numba_s_own_simulator_runs_the_same_kernel():
    code = ("import numpy as np, course_lib\n"
            "from course_lib import checks\n"
            "from course_lib.kernels import flash_numba_cuda as fnc\n"
            "rng = np.random.default_rng(0)\n"
            "q = rng.standard_normal((1, 4, 11, 6)).astype(np.float32)\n"
            "k, v = (rng.standard_normal((1, 2, 9, 6)).astype(np.float32) for _ in range(2))\n"
            "for x in (q, k, v):\n"
            "    x.setflags(write=False)\n"   # inputs are never written back, as a launch's inputs are not
            "out, lse = course_lib.attention(q, k, v, impl='flash_numba_cuda', causal=True, block_q=4,"
            " block_k=4, return_lse=True)\n"
            "checks.check_attention(out, q, k, v, lse=lse, causal=True)\n"
            "print(fnc.where())\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    verdict, runner = result.stdout.splitlines()[-2:]
    assert verdict.startswith("PASS attention (float32, q 1x4x11x6, k/v 1x2x9x6/1x2x9x6, causal): out and lse within")
    assert runner == "numba simulator"
