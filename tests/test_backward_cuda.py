"""The CUDA backward (backward impl ``flash_numba_cuda``) in numba's simulator: every case against the float64
gradient, and the planted mistakes caught (tests/backward_cuda_sim.py, in a subprocess: the simulator must
be chosen before numba is imported)."""

import pytest

import course_lib
from course_lib.bench.cases import BACKWARD_CASES
from course_lib.kernels import backward_numba_cuda as bk

from conftest import simulator_verdicts


@pytest.fixture(scope="module")
def verdicts():
    return simulator_verdicts("backward_cuda_sim.py")


def test_every_case_matches_the_float64_gradient(verdicts):
    cases = {k: v for k, v in verdicts.items() if not k.startswith("planted/")}
    assert len(cases) == len(BACKWARD_CASES) and all(v == "PASS" for v in cases.values()), cases


@pytest.mark.parametrize("kind", ["gqa_not_summed", "mask_forgotten"])
def test_a_planted_mistake_fails_the_check(verdicts, kind):
    assert verdicts[f"planted/{kind}"].startswith("FAIL"), verdicts


def test_listed_only_where_a_gpu_or_the_simulator_runs_it():
    listed = "flash_numba_cuda" in course_lib.available_backward_impls()
    assert listed == bk.available()
