"""``blas_add.dot_add``: out += a @ b in one gemm (beta = 1), for every layout the backward feeds it."""
import numba
import numpy as np
import pytest

from course_lib.kernels.blas_add import dot_add


@numba.njit
def _dot_add(a, b, out, transpose_a, transpose_b):
    if transpose_a and transpose_b:
        dot_add(a.T, b.T, out)
    elif transpose_a:
        dot_add(a.T, b, out)
    elif transpose_b:
        dot_add(a, b.T, out)
    else:
        dot_add(a, b, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_dot_add_adds_the_product_to_what_out_holds(dtype, transpose_a, transpose_b):
    rng = np.random.default_rng(0)
    m, k, n = 7, 5, 3                       # no two alike: a swapped dimension or leading size shows
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(dtype)
    out = rng.standard_normal((m, n)).astype(dtype)
    expected = out.astype(np.float64) + (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b)
    _dot_add(a, b, out, transpose_a, transpose_b)
    assert np.allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(out, expected - 1e-3)                    # the check can fail


def test_dot_add_writes_only_its_tile_of_a_larger_array():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 4)), rng.standard_normal((4, 3))
    big = np.zeros((3, 6, 3))

    @numba.njit
    def into_tile(a, b, big):
        dot_add(a, b, big[1, 2:4])

    into_tile(a, b, big)
    assert np.allclose(big[1, 2:4], a @ b)
    big[1, 2:4] = 0
    assert not big.any()


def test_dot_add_refuses_shapes_that_do_not_match():
    with pytest.raises(ValueError, match="shapes do not match"):
        _dot_add(np.zeros((2, 3)), np.zeros((4, 2)), np.zeros((2, 2)), False, False)
