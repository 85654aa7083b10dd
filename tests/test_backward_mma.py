"""The tensor-core backward (backward impl ``cuda_mma_f16``) in numba's simulator, its mma.sync emulated by
``tensor_cores.sim``: the emulated instruction against numpy, every case against the float64 gradient, and the
planted mistakes caught (tests/backward_mma_sim.py, in a subprocess: the simulator must be chosen before
numba is imported).  On a GPU the same checks run through benchmarks/gpu_backward.py --parts check_mma."""

import pytest

import course_lib
from course_lib.kernels.tensor_cores import backward as tb

from conftest import simulator_verdicts


@pytest.fixture(scope="module")
def verdicts():
    return simulator_verdicts("backward_mma_sim.py")


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_the_emulated_mma_is_the_matrix_product(verdicts, kind):
    assert verdicts[f"unit/mma_{kind}"] == "PASS", verdicts


def test_every_case_matches_the_float64_gradient(verdicts):
    cases = {k: v for k, v in verdicts.items() if "/" not in k}
    assert len(cases) == 6 and all(v == "PASS" for v in cases.values()), cases


@pytest.mark.parametrize("kind", ["gqa_not_summed", "mask_forgotten", "half_a_swapped"])
def test_a_planted_mistake_fails_the_check(verdicts, kind):
    assert verdicts[f"planted/{kind}"].startswith("FAIL"), verdicts


def test_listed_only_where_a_gpu_or_the_simulator_runs_it():
    listed = "cuda_mma_f16" in course_lib.available_backward_impls()
    assert listed == tb.available()


def test_the_tiles_fit_static_shared_memory_at_every_head_dim():
    for D in (8, 40, 64, 96, 128, 256):
        tiling = tb.default_tiling("f16", D, D)
        assert tb.shared_bytes("f16", tiling, D, D) <= tb.STATIC_SHARED, (D, tiling)
