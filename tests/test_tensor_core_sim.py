"""The tensor-core forward (impls ``cuda_mma_*``, chapter 11's chain of versions) in numba's simulator, its
instructions emulated by ``tensor_cores.sim``: every version for every kind of operand on chapter 10's
awkward cases against the float64 reference, the emulated mma_tf32, ldmatrix and cp.async against numpy, and
the planted mistakes caught (tests/forward_mma_sim.py, in a subprocess: the simulator must be chosen before
numba is imported).  On a GPU the same cases run through benchmarks/gpu_mma.py --parts check."""

import pytest

import course_lib
from course_lib.kernels.tensor_cores import forward as tf

import forward_mma_sim as sweep  # the sweep's own plan, read without the simulator
from conftest import simulator_verdicts


@pytest.fixture(scope="module")
def verdicts():
    return simulator_verdicts("forward_mma_sim.py", timeout=1500)


def test_the_sweep_meets_every_version_kind_and_case():
    todo = sweep.plan()
    versions, kinds, cases = ({t[i] for t in todo} for i in range(3))
    assert versions == {*sweep.VERSIONS, "default"} and kinds == set(sweep.KINDS)
    assert cases == set(sweep.FORWARD_CASES)
    assert {tf.version_of(sweep.tiling_for(v, "f16")) for v in sweep.VERSIONS if v != "split_once"} == \
        set(sweep.VERSIONS) - {"split_once"}


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32x3"])
def test_every_version_matches_the_float64_reference(verdicts, kind):
    ran = {key: v for key, v in verdicts.items() if key.split("/")[1:2] == [kind]}
    assert ran and all(v == "PASS" for v in ran.values()), {k: v for k, v in ran.items() if v != "PASS"}


def test_one_tf32_product_misses_float32s_rule_as_on_the_gpu(verdicts):
    """One TF32 product (what allow_tf32 gives) is the step that shows why 3xTF32: it fails float32's rule,
    but by TF32's rounding (10 mantissa bits), not by a wrong answer."""
    ran = {key: v for key, v in verdicts.items() if key.split("/")[1:2] == ["tf32x1"]}
    missed = [v for v in ran.values() if v.startswith("FAIL float32's rule, within TF32's rounding")]
    assert ran and all(v == "PASS" or v in missed for v in ran.values()), ran
    assert len(missed) >= len(ran) // 2, ran


@pytest.mark.parametrize("unit", ["mma_tf32", "ldmatrix", "ldmatrix_trans", "cp_async"])
def test_each_emulated_instruction_does_what_the_ptx_isa_says(verdicts, unit):
    assert verdicts[f"unit/{unit}"] == "PASS", verdicts[f"unit/{unit}"]


@pytest.mark.parametrize("kind", ["half_a_swapped", "v_not_transposed", "one_shuffle", "mask_forgotten"])
def test_a_planted_mistake_fails_the_check(verdicts, kind):
    assert verdicts[f"planted/{kind}"].startswith("FAIL"), verdicts[f"planted/{kind}"]


def test_listed_only_on_a_gpu():
    """The registry lists the forward impls on a real GPU alone (``gpu_only``): the simulator runs them only at
    the small shapes of this sweep, not in the loops over every impl."""
    assert all(name not in course_lib.available_impls() for name in ("cuda_mma_f16", "cuda_mma_3xtf32")) \
        or tf.on_gpu()
