"""impl ``naive``: chapter 01's attention in the input dtype.

The same math as the reference, in the precision of ``core.rules``: S, the
softmax and P V in the accumulation dtype (float32, float64 for float64
inputs); float16 / bfloat16 rounded back to their dtype where a framework
stores them (S after Q K^T, P before P V, O); float8 inputs follow FA3
(S in float32, the unnormalised P rounded to e4m3, O returned in float32).  Its error against the float64
reference is the yardstick of the low-precision tolerance rule in
``course_lib.checks``.
"""
from ..core import rules
from ..core.reference import attention_math


def attention_forward(q, k, v, opts, mask):
    out, lse = attention_math(q, k, v, opts, mask, rules.acc_dtype(q.dtype), round_dtype=rules.p_round_dtype(q.dtype))
    return out.astype(rules.out_dtype(q.dtype)), lse.astype(rules.lse_dtype(q.dtype))
