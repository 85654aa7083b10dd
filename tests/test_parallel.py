"""Attention across ranks (chapter 14): sharding, the local causal offset, ring and all-to-all
over real torch.distributed processes (gloo), and runs that fail instead of hanging.

The multi-process tests start real spawned ranks on this machine; each group
is started once and runs several jobs, so the file stays near a minute.
"""
import subprocess
import sys
import time

import numpy as np
import pytest

from course_lib import checks
from course_lib.parallel import costmodel, sharding
from course_lib.parallel.ranks import RankFailed, RankTimeout
from course_lib.parallel.run import Job, Problem, run_jobs
from course_lib.parallel.shard_attention import local_partial, mask_call, simulate_ring

from conftest import make_qkv


def dense_partial(q, k, v, d):
    """(out, lse) of q over k, v with local query i seeing key j iff j <= i + d, straight from the mask."""
    nq, nk = q.shape[2], k.shape[2]
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[3])
    s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + d, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m0 = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m0)
    l = p.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m0[..., 0] + np.log(np.where(l > 0, l, 1)), -np.inf)
    return (p @ v) / np.where(l > 0, l, 1)[..., None], lse


@pytest.mark.parametrize("nq,nk", [(5, 5), (4, 7), (7, 3), (1, 6)])
def test_the_local_call_sees_exactly_the_keys_on_or_left_of_the_shifted_diagonal(nq, nk):
    q, k, v = make_qkv(nq * 10 + nk, 1, 2, 2, nq, nk, 4, 3)
    for d in range(-nq - 1, nk + 2):
        out, lse = local_partial(q, k, v, d, causal=True, impl="reference")
        expected_out, expected_lse = dense_partial(q, k, v, d)
        np.testing.assert_allclose(out, expected_out, atol=1e-12, err_msg=f"d={d}")
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
        np.testing.assert_allclose(lse[np.isfinite(lse)], expected_lse[np.isfinite(expected_lse)], atol=1e-12)


def test_a_block_nothing_sees_is_skipped_and_a_block_everything_sees_is_unmasked():
    assert mask_call(-5, 5, 5, causal=True) is None
    assert mask_call(4, 5, 5, causal=True) == (5, {})
    assert mask_call(0, 5, 5, causal=True) == (5, {"window_size": (-1, 0)})
    assert mask_call(-1, 5, 5, causal=True) == (4, {"causal": True, "causal_align": "bottom_right"})


@pytest.mark.parametrize("scheme", sharding.SCHEMES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_scheme_deals_each_position_to_exactly_one_rank(scheme, world_size):
    pieces = sharding.layout(scheme, 24, world_size)
    everything = np.sort(np.concatenate([sharding.positions(p) for p in pieces]))
    np.testing.assert_array_equal(everything, np.arange(24))
    assert {len(sharding.positions(p)) for p in pieces} == {24 // world_size}


def test_a_length_that_does_not_split_is_refused_with_the_divisor():
    with pytest.raises(ValueError, match="divisible by 8"):
        sharding.layout("zigzag", 20, 4)


@pytest.mark.parametrize("scheme", sharding.SCHEMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("impl", ["flash_numpy", "torch_sdpa"])
def test_the_simulated_ring_gives_full_attention_for_every_scheme(scheme, causal, dtype, impl):
    q, k, v = make_qkv(np.random.default_rng(3), 1, 3, 3, 24, 24, 8, 8, dtype=dtype)
    for world_size in (3, 4):
        if 24 % (2 * world_size if scheme == "zigzag" else world_size):
            continue
        out, lse = simulate_ring(q, k, v, world_size, scheme=scheme, causal=causal, impl=impl)
        checks.check_attention(out, q, k, v, lse=lse, causal=causal,
                               name=f"simulated ring {scheme} W={world_size} {impl}")


def test_causal_contiguous_sharding_idles_ranks_and_zigzag_does_not():
    work = {s: sharding.step_work(s, 64, 4, causal=True) for s in sharding.SCHEMES}
    assert sharding.imbalance(work["contiguous"]) > 1.5
    assert sharding.imbalance(work["zigzag"]) == 1.0
    assert 1.0 < sharding.imbalance(work["striped"]) < 1.1
    for w in work.values():   # the same triangle, dealt differently
        assert w.sum() == 64 * 65 // 2
    assert sharding.imbalance(sharding.step_work("contiguous", 64, 4, causal=False)) == 1.0


def test_the_ring_moves_k_and_v_world_minus_one_times_ulysses_every_tensor_once():
    shape = dict(batch=1, heads=8, heads_k=8, seqlen=1024, head_dim=64, itemsize=4)
    per_step = costmodel.ring_bytes_per_step(world_size=4, **shape)
    assert per_step == 1 * 8 * 256 * 2 * 64 * 4
    assert costmodel.ring_bytes(world_size=4, **shape) == 3 * per_step
    # Ulysses: each rank keeps 1/W of what it holds and sends the rest, for q, k, v, and out + lse
    held = 1 * 8 * 256 * (64 + 64 + 64 + 65) * 4
    assert costmodel.ulysses_bytes(world_size=4, **shape) == held * 3 // 4


def test_the_alpha_beta_fit_recovers_a_known_line():
    sizes = np.array([8, 1024, 65536, 1 << 20, 1 << 24])
    alpha, beta = costmodel.fit_alpha_beta(sizes, 30e-6 + sizes / 2e9)
    assert alpha == pytest.approx(30e-6, rel=1e-6) and beta == pytest.approx(2e9, rel=1e-6)


# -- real processes ------------------------------------------------------------

JOBS = [Job("ring", True, "zigzag"), Job("ring", True, "striped"), Job("ring", True, "contiguous", overlap=False),
        Job("ring", False, "zigzag"), Job("ulysses", True), Job("ulysses", False)]


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_and_ulysses_on_real_ranks_match_the_single_process_reference(world_size):
    problem = Problem(batch=1, heads=4, seqlen=32, head_dim=8, dtype="float32", seed=world_size)
    q, k, v = problem.inputs()
    for job, (out, lse, timings) in zip(JOBS, run_jobs(JOBS, world_size, problem, timeout=60)):
        checks.check_attention(out, q, k, v, lse=lse, causal=job.causal, name=job.label(world_size))
        steps = world_size if job.strategy == "ring" else 1
        assert all(len(t[0]["compute_s"]) == steps for t in timings)


def test_the_command_line_prints_pass_when_the_ranks_agree_with_the_reference():
    done = subprocess.run([sys.executable, "-m", "course_lib.parallel", "--world-size", "2", "--strategy", "ring",
                           "--causal", "--check", "--seqlen", "32"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("PASS ring (zigzag), 2 ranks, causal")


def test_a_rank_that_raises_ends_the_run_with_its_traceback():
    with pytest.raises(RankFailed, match=r"rank 1 raised(.|\n)*fault injected on rank 1"):
        run_jobs([Job("ring")], 2, Problem(seqlen=16), fault=("raise", 1), timeout=30)


def test_a_rank_that_hangs_ends_the_run_at_the_deadline_not_never():
    start = time.monotonic()
    with pytest.raises(RankTimeout, match=r"did not finish within 2 s"):
        run_jobs([Job("ring")], 2, Problem(seqlen=16), fault=("hang", 0), timeout=2)
    assert time.monotonic() - start < 90   # startup on a loaded machine, plus the 2 s


def test_ulysses_refuses_heads_that_do_not_split_before_starting_any_rank():
    with pytest.raises(ValueError, match="heads .3. and heads_k .3. divisible by the world size .2."):
        run_jobs([Job("ulysses")], 2, Problem(heads=3, seqlen=16))

