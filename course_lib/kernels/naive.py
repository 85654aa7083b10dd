"""impl ``naive``: chapter 01's attention in the input dtype.

The same math as the reference, but float32 inputs stay float32 and float16 /
bfloat16 inputs are multiplied with float32 accumulation and rounded back to
their dtype where a GPU would store them (S after Q K^T, P before P V, O).
Its error against the float64 reference is the yardstick of the low-precision
tolerance rule in ``course_lib.checks``.
"""
import numpy as np

from ..core.reference import LOW_PRECISION, attention_math, lse_dtype


def attention_forward(q, k, v, opts, mask):
    if q.dtype.name in LOW_PRECISION:
        out, lse = attention_math(q, k, v, opts, mask, np.float32, round_dtype=q.dtype)
    else:
        out, lse = attention_math(q, k, v, opts, mask, q.dtype.type)
    return out.astype(q.dtype), lse.astype(lse_dtype(q.dtype))
