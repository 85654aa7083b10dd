"""flash_numba_cpu's steps (chapter 08) and the conformance rules the CPU sweep found:
lse with no value columns, option values that do not survive float32, tiles larger
than the problem, masked arrays; the work order, the key split and its merge, the tile buffers a thread reuses and the
counter that hands out the work items."""
import numpy as np
import pytest

import course_lib
from course_lib import checks
from course_lib.core import rules
from course_lib.core.options import attention_options
from course_lib.kernels import cpu_steps as fnc

from conftest import make_qkv

STEP_IMPLS = ["flash_numba_cpu_microkernel", "flash_numba_cpu_blas", "flash_numba_cpu_rowvec",
              "flash_numba_cpu_balanced", "flash_numba_cpu_tuned", "flash_numba_cpu_exp2", "flash_numba_cpu_wide",
              "flash_numba_cpu_scratch", "flash_numba_cpu"]


def qkv(shape_q, shape_kv, dv=None, dtype=np.float32, seed=0):
    """conftest's make_qkv, given q's and k's shapes."""
    (batch, heads, nq, d), (_, heads_k, nk, _) = shape_q, shape_kv
    return make_qkv(seed, batch, heads, heads_k, nq, nk, d, dv or shape_kv[3], dtype)


@pytest.mark.parametrize("impl", ["reference", "naive", "flash_numpy", "flash_numba_cpu"])
def test_no_value_columns_still_give_the_rows_lse(impl):
    q, k, v = qkv((1, 2, 9, 8), (1, 2, 13, 8), dv=1)
    _, want = course_lib.attention(q, k, v, impl="reference", causal=True, return_lse=True)
    out, lse = course_lib.attention(q, k, v[..., :0], impl=impl, causal=True, return_lse=True)
    assert out.shape == (1, 2, 9, 0)
    np.testing.assert_allclose(lse, want, rtol=1e-5)
    assert np.all(np.isfinite(lse))


@pytest.mark.parametrize("name, value", [("softcap", 1e-50), ("softcap", 1e39), ("softmax_scale", 1e39),
                                         ("softmax_scale", 1e-50)])
def test_a_value_float32_cannot_hold_is_refused_by_name(name, value):
    q, k, v = qkv((1, 1, 4, 8), (1, 1, 4, 8))
    with pytest.raises(ValueError, match=f"{name} = .* does not survive float32"):
        course_lib.attention(q, k, v, impl="flash_numba_cpu", **{name: value})


def test_float64_inputs_keep_values_float32_cannot_hold():
    q, k, v = qkv((1, 1, 4, 8), (1, 1, 4, 8), dtype=np.float64)
    out = course_lib.attention(q, k, v, impl="flash_numba_cpu", softcap=1e-50)
    checks.check_attention(out, q, k, v, softcap=1e-50)


def test_a_masked_array_is_refused():
    q, k, v = qkv((1, 1, 4, 8), (1, 1, 4, 8))
    masked = np.ma.masked_array(k, mask=np.zeros_like(k, dtype=bool))
    with pytest.raises(TypeError, match="k must be a plain numpy array, got a masked array"):
        course_lib.attention(q, masked, v, impl="flash_numba_cpu")


@pytest.mark.parametrize("impl", STEP_IMPLS)
def test_a_tile_larger_than_the_problem_is_the_problem(impl):
    q, k, v = qkv((1, 2, 33, 16), (1, 2, 45, 16))
    out, lse = course_lib.attention(q, k, v, impl=impl, block_q=10 ** 8, block_k=10 ** 8, causal=True,
                                    return_lse=True)
    checks.check_attention(out, q, k, v, lse=lse, causal=True)


def test_tile_sizes_fill_at_most_half_the_l2():
    for l2 in (256 * 1024, 512 * 1024, 1024 * 1024, 4 * 1024 * 1024):
        Br, Bc = fnc.tile_sizes_for(64, 64, 4, l2)
        assert 4 * (Br * 64 + Bc * 128 + Br * Bc + 2 * Br * 64) <= l2 // 2
    assert fnc.tile_sizes_for(64, 64, 4, 1024 * 1024) > fnc.tile_sizes_for(64, 64, 4, 256 * 1024)
    assert fnc.tile_sizes_for(64, 64, 4, 16 * 1024) == (64, 64)    # never below the course's tile


def test_balanced_items_alternate_heaviest_and_lightest():
    tiles = np.array([[rules.FULL if c <= r else rules.EMPTY for c in range(4)] for r in range(4)], np.int8)
    items = fnc.balanced_items(1, 2, tiles, 1)
    cost = [int(np.count_nonzero(tiles[t] != rules.EMPTY)) for t in items[:, 2]]
    assert cost == [4, 1, 4, 1, 3, 2, 3, 2]
    zigzag = fnc.zigzag_items(1, 1, tiles, 1)
    assert zigzag[:, 2].tolist() == [0, 3, 1, 2]
    assert sorted(map(tuple, items.tolist())) == sorted(map(tuple, fnc.zigzag_items(1, 2, tiles, 1).tolist()))


def test_decoding_splits_the_keys_and_few_items_only():
    assert fnc.key_splits(1, 2, 1, 64, threads=2) == 4          # 2 items for 2 threads: 4 splits make 8
    assert fnc.key_splits(8, 16, 1, 64, threads=2) == 1         # 128 items keep both cores busy
    assert fnc.key_splits(1, 1, 1, 3, threads=2) == 3           # never more splits than key tiles


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_split_keys_merged_by_the_lse_rule_match_one_pass(splits):
    q, k, v = qkv((2, 4, 1, 32), (2, 2, 300, 32), dv=16)
    opts = attention_options(batch=2, heads=4, head_dim=32, block_k=32)
    mask = opts.mask(1, 300)
    out, lse = fnc.flash_forward(q, k, v, opts, mask, splits=splits)
    whole, whole_lse = fnc.flash_forward(q, k, v, opts, mask, splits=1)
    np.testing.assert_allclose(out, whole, atol=2e-6)
    np.testing.assert_allclose(lse, whole_lse, atol=2e-6)
    checks.check_attention(out, q, k, v, lse=lse, block_k=32)


def test_a_split_that_sees_no_key_adds_nothing():
    q, k, v = qkv((1, 1, 3, 8), (1, 1, 64, 8))
    opts = attention_options(batch=1, heads=1, head_dim=8, block_k=8,
                                                     window_size=(2, 0))
    out, lse = fnc.flash_forward(q, k, v, opts, opts.mask(3, 64), splits=4)  # the first splits see nothing
    checks.check_attention(out, q, k, v, lse=lse, window_size=(2, 0))


def test_the_host_copies_no_input_that_is_already_contiguous_in_the_accumulation_dtype():
    from course_lib.kernels import launch
    q, k, v = qkv((1, 2, 8, 4), (1, 2, 8, 4))
    opts = attention_options(batch=1, heads=2, head_dim=4)
    _, qa, ka, va = launch.prepare(q, k, v, opts, opts.mask(8, 8), 4, 4)
    assert np.shares_memory(qa, q) and np.shares_memory(ka, k) and np.shares_memory(va, v)
    q16 = q.astype(np.float16)
    _, qa, _, _ = launch.prepare(q16, k, v, opts, opts.mask(8, 8), 4, 4)
    assert qa.dtype == np.float32 and not np.shares_memory(qa, q16)


def test_the_wide_step_takes_pytorchs_tiles():
    assert [fnc.wide_tiles(n) for n in (1, 191, 192, 767, 768, 4096)] == [(32, 512), (32, 512), (64, 512),
                                                                          (64, 512), (256, 512), (256, 512)]


def test_balanced_items_give_each_threads_run_the_same_work():
    tiles = np.array([[rules.FULL if c <= r else rules.EMPTY for c in range(8)] for r in range(8)], np.int8)
    items = fnc.balanced_items(1, 2, tiles, 1)
    cost = np.array([int(np.count_nonzero(tiles[t] != rules.EMPTY)) for t in items[:, 2]])
    for runs in (2, 4):                                   # prange's contiguous runs, one per thread
        shares = [int(run.sum()) for run in np.array_split(cost, runs)]
        assert max(shares) - min(shares) <= 8             # sorted heaviest first and cut in two: 52 against 20


def test_heaviest_first_sorts_the_items_by_cost_and_nothing_else():
    tiles = np.array([[rules.FULL if c <= r else rules.EMPTY for c in range(4)] for r in range(4)], np.int8)
    items = fnc.heaviest_first_items(1, 2, tiles, 1)
    cost = [int(np.count_nonzero(tiles[t] != rules.EMPTY)) for t in items[:, 2]]
    assert cost == [4, 4, 3, 3, 2, 2, 1, 1]
    assert sorted(map(tuple, items.tolist())) == sorted(map(tuple, fnc.zigzag_items(1, 2, tiles, 1).tolist()))


def test_thread_runs_are_one_per_thread_and_cover_every_item():
    assert fnc.thread_runs(5, 2).tolist() == [0, 2, 5]
    assert fnc.thread_runs(1, 4).tolist() == [0, 0, 0, 0, 1]      # a thread may get none


def test_the_counter_hands_out_every_number_once_across_threads():
    import numba

    @numba.njit(parallel=True)
    def draw(counter, taken, workers):
        for _ in numba.prange(workers):
            n = fnc.fetch_add(counter)
            while n < taken.shape[0]:
                taken[n] += 1
                n = fnc.fetch_add(counter)

    counter, taken = np.zeros(1, np.int64), np.zeros(200_000, np.int64)
    draw(counter, taken, 8)
    assert np.all(taken == 1)                      # a plain counter[0] += 1 loses and repeats numbers
    assert counter[0] == taken.shape[0] + 8        # every worker drew once more, and stopped


@pytest.mark.parametrize("impl", ["flash_numba_cpu_scratch", "flash_numba_cpu"])
def test_a_thread_reusing_its_tile_buffers_carries_nothing_from_one_item_to_the_next(impl):
    import numba
    q, k, v = qkv((1, 3, 70, 16), (1, 3, 70, 16))
    q[0, 1, 5] = np.nan                        # one row of head 1: items of other heads must not see it
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)               # one thread: every item goes through the same buffers
        out, lse = course_lib.attention(q, k, v, impl=impl, causal=True, block_q=16, block_k=16, return_lse=True)
    finally:
        numba.set_num_threads(threads)
    assert np.isnan(out[0, 1, 5]).all() and np.isnan(lse[0, 1, 5])
    rows = np.ones(out.shape[:3], bool)
    rows[0, 1, 5] = False
    assert not np.isnan(out[rows]).any()
    clean = q.copy()
    clean[0, 1, 5] = 0
    want, want_lse = course_lib.attention(clean, k, v, impl="reference", causal=True, return_lse=True)
    np.testing.assert_allclose(out[rows], want[rows], atol=2e-5)      # tail tiles (70 = 4 x 16 + 6) among them
    np.testing.assert_allclose(lse[rows], want_lse[rows], atol=2e-5)


def test_a_spawned_process_runs_the_kernel_after_its_parent_did():
    # numba's threading layer does not survive fork: the course starts processes with spawn
    import multiprocessing
    q, k, v = qkv((1, 2, 40, 8), (1, 2, 40, 8))
    here = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True)     # the parent's threads exist
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.apply(course_lib.attention, (q, k, v), {"impl": "flash_numba_cpu", "causal": True})
    # Not bit for bit: OpenBLAS's AVX-512 kernels may sum a tile in another order where the other process's
    # buffers are aligned differently (a CI machine showed last-bit differences); a crashed, hung or
    # garbage-producing child fails either way.
    want = course_lib.attention(q, k, v, impl="reference", causal=True)
    np.testing.assert_allclose(there, here, rtol=0, atol=1e-6)
    np.testing.assert_allclose(there, want, rtol=0, atol=2e-5)


def test_the_course_starts_its_worker_processes_with_spawn():
    import inspect

    from course_lib.grading import pipeline
    from course_lib.parallel import ranks
    for module in (ranks, pipeline):
        source = inspect.getsource(module)
        assert 'get_context("spawn")' in source and "os.fork(" not in source
