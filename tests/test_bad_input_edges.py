"""Bad input at the edges the forward already guards: the backward, fp8's descales, huge values, threads.

Each case gets the right answer or a clear error naming what to change, in every impl that runs here;
never a silent wrong gradient, never NaN from finite inputs, never a crashed process.
"""
import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import course_lib
from course_lib.kernels.cpu_steps import scipy_openblas

from conftest import make_qkv

CPU_IMPLS = [name for name in course_lib.available_impls() if "cuda" not in name]
BACKWARD_IMPLS = [name for name in course_lib.available_backward_impls() if "cuda" not in name]
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def problem(Nq=9, Nk=11, D=8):
    return make_qkv(0, 1, 2, 2, Nq, Nk, D, dtype=np.float32)


@pytest.mark.parametrize("impl", BACKWARD_IMPLS)
def test_the_backward_refuses_fp8_inputs_and_says_what_to_do(impl):
    q, k, v = (x.astype(FP8) for x in problem())
    out = np.zeros((1, 2, 9, 8), np.float32)
    lse = np.zeros((1, 2, 9), np.float32)
    with pytest.raises(TypeError, match="no float8_e4m3fn.*dequantise"):
        course_lib.attention_backward(q, k, v, out, lse, out, impl=impl)
    cu = np.array([0, 9], np.int32), np.array([0, 11], np.int32)
    packed = [x[0].transpose(1, 0, 2) for x in (q, k, v)]
    with pytest.raises(TypeError, match="no float8_e4m3fn"):
        course_lib.attention_backward_varlen(*packed, out[0].transpose(1, 0, 2), lse[0], out[0].transpose(1, 0, 2),
                                             *cu, impl=impl)


@pytest.mark.parametrize("impl", BACKWARD_IMPLS)
@pytest.mark.parametrize("option", [dict(softcap=1e-50), dict(softcap=1e39), dict(softmax_scale=1e39),
                                    dict(alibi_slopes=np.array([1e39, 0.5]))])
def test_the_backward_refuses_what_float32_cannot_hold_as_the_forward_does(impl, option):
    q, k, v = problem()
    out, lse = course_lib.attention(q, k, v, return_lse=True)
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"{name}.*does not survive float32"):
        course_lib.attention(q, k, v, **option)
    with pytest.raises(ValueError, match=f"{name}.*does not survive float32"):
        course_lib.attention_backward(q, k, v, out, lse, out, impl=impl, **option)


@pytest.mark.parametrize("value", [1e39, 1e-50])
def test_an_fp8_descale_float32_cannot_hold_is_refused(value):
    q, k, v = (x.astype(FP8) for x in problem())
    scale = np.ones((1, 2))
    with pytest.raises(ValueError, match="q_descale must be within float32's range"):
        course_lib.attention(q, k, v, q_descale=scale * value, k_descale=scale, v_descale=scale)


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_huge_finite_inputs_get_the_answer_or_a_clear_error_never_nan(impl):
    q, k, v = problem()
    q, k = q * np.float32(1e19), k * np.float32(1e19)
    expected = course_lib.attention(q, k, v, impl="reference")
    try:
        out = course_lib.attention(q, k, v, impl=impl)
    except ValueError as error:
        assert "overflowed float32" in str(error) and "scale them down" in str(error)
        return
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, atol=1e-3)


def test_nan_inputs_still_give_nan_not_an_error():
    q, k, v = problem()
    v[0, 0, 3, 2] = np.nan
    out = course_lib.attention(q, k, v, impl="flash_numpy")
    assert np.isnan(out).any()


@pytest.mark.skipif(scipy_openblas() is None, reason="SciPy's OpenBLAS not found")
def test_two_threads_calling_a_compiled_impl_get_its_answer_and_leave_blas_threads_alone():
    blas = scipy_openblas()
    before = blas.scipy_openblas_get_num_threads()
    q, k, v = problem(Nq=200, Nk=300, D=32)
    want = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True)
    got, errors = [None, None], []

    def call(i):
        try:
            for _ in range(5):
                got[i] = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True)
        except Exception as error:  # noqa: BLE001 - the test reports any failure of a thread
            errors.append(error)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    assert blas.scipy_openblas_get_num_threads() == before


def test_two_threads_under_numbas_workqueue_layer_do_not_abort_the_process():
    script = (
        "import threading, numpy as np, course_lib\n"
        "rng = np.random.default_rng(0)\n"
        "q, k, v = (rng.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (64, 96, 96))\n"
        "course_lib.attention(q, k, v, impl='flash_numba_cpu')\n"
        "ts = [threading.Thread(target=lambda: [course_lib.attention(q, k, v, impl='flash_numba_cpu')"
        " for _ in range(20)]) for _ in range(2)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print('done')\n")
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue", "NUMBA_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


def test_fa1s_fp8_refusal_names_itself_and_the_impls_that_take_fp8():
    q, k, v = (x.astype(FP8) for x in problem())
    scale = np.ones((1, 2))
    with pytest.raises(TypeError, match="flash_numpy_fa1.*use its FA2-order twin flash_numpy"):
        course_lib.attention(q, k, v, impl="flash_numpy_fa1", q_descale=scale, k_descale=scale, v_descale=scale)


def test_the_api_says_which_impls_cannot_take_any_block_size():
    doc = course_lib.attention.__doc__
    assert "cuda_mma_" in doc and "MmaTiling" in doc and "flash_numba_cuda" in doc and "48 KB" in doc


def test_two_threads_calling_the_cuda_simulator_get_its_answer():
    script = (
        "import threading, numpy as np, course_lib\n"
        "rng = np.random.default_rng(0)\n"
        "q, k, v = (rng.standard_normal((1, 1, n, 8)).astype(np.float32) for n in (5, 7, 7))\n"
        "want = course_lib.attention(q, k, v, impl='reference')\n"
        "errors = []\n"
        "def call():\n"
        "    try:\n"
        "        out = course_lib.attention(q, k, v, impl='flash_numba_cuda', block_q=4, block_k=4)\n"
        "        assert np.allclose(out, want, atol=1e-5)\n"
        "    except Exception as error:\n"
        "        errors.append(repr(error))\n"
        "ts = [threading.Thread(target=call) for _ in range(2)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print('errors', errors)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "errors []" in run.stdout, (run.stdout + run.stderr)[-2000:]
