"""Random q, k, v for the tests of the reference, the tolerance rule and the conventions."""
import numpy as np


def make_qkv(rng, batch, heads, heads_k, nq, nk, d, dv, dtype=np.float64):
    q = rng.standard_normal((batch, heads, nq, d))
    k = rng.standard_normal((batch, heads_k, nk, d))
    v = rng.standard_normal((batch, heads_k, nk, dv))
    return tuple(x.astype(dtype) for x in (q, k, v))
