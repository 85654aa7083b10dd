"""The capstone benchmark's float16 check isolates what chapter 16's post-mortem says it does."""
import importlib.util
from pathlib import Path

import pytest

from course_lib.kernels import cpu_steps

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "capstone.py"


def capstone():
    spec = importlib.util.spec_from_file_location("capstone", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not cpu_steps.available(), reason="numba is not installed")
def test_the_kernel_with_p_rounded_in_its_loop_is_the_float16_call():
    records = {r["case"]: r for r in capstone().conversion_group(rounds=1, n=96)}
    assert set(records) == {"float16 call", "inputs to float32 alone", "kernel, P rounded to float16 in the loop",
                            "kernel, no rounding (the float32 launch)"}
    assert all(r["rounded_kernel_is_the_float16_call"] for r in records.values())
    assert records["float16 call"]["round_bits"] == 11          # float16's significand, implicit bit included
    assert all(r["rounds"] == 1 and r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in records.values())
