"""Run attention at a chosen precision: the hook a model uses to change its attention's precision.

``attention_at(precision, q, k, v, impl=..., **options)`` takes q, k, v in
any float dtype (a model's float32 activations), stores them the way
``precision`` says, runs ``course_lib.attention`` on them and returns out in
q's own dtype, so a model's code does not change:

- ``"fp32"`` / ``"fp64"``: the inputs in float32 / float64;
- ``"fp16"`` / ``"bf16"``: the inputs in float16 / bfloat16 (P rounded to it, O accumulated in float32);
- ``"fp8"``: quantised to float8_e4m3fn with one descale per (batch, K / V head)
  (``formats.quantize``), FA3's recipe;
- ``"auto"``: ``fallback.choose_precision(q, k, v, budget)`` picks one of
  fp8 / fp16 / fp32 for this call.

``precision_attention(precision, impl=...)`` returns that as a function with
``course_lib.attention``'s signature, to hand to a model in place of it.
"""
from __future__ import annotations

from functools import partial

import ml_dtypes
import numpy as np

from .. import api
from .formats import quantize

PRECISIONS = ("fp64", "fp32", "fp16", "bf16", "fp8", "auto")
_CASTS = {"fp64": np.float64, "fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def cast_inputs(q, k, v, precision):
    """(q, k, v, descales): the inputs stored at ``precision``; descales a dict of FA3's keywords for fp8."""
    if precision == "fp8":
        heads_k = k.shape[1]
        (q8, qd), (k8, kd), (v8, vd) = (quantize(x, "float8_e4m3fn", "head", heads_k) for x in (q, k, v))
        return q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    if precision not in _CASTS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cast = _CASTS[precision]
    return q.astype(cast), k.astype(cast), v.astype(cast), {}


def attention_at(precision, q, k, v, *, impl="flash_numpy", budget=None, return_lse=False, **options):
    """``course_lib.attention`` with the inputs stored at ``precision``; out comes back in q's dtype.

    ``precision="auto"`` needs ``budget`` (the largest error of out allowed,
    ``fallback.choose_precision``'s).  lse, with ``return_lse``, is float32 (float64 for fp64).
    """
    if precision == "auto":
        from .fallback import choose_precision
        if budget is None:
            raise ValueError("precision='auto' needs budget, the largest error of out you accept (e.g. 1e-2)")
        precision = choose_precision(q, k, v, budget).precision
    elif budget is not None:
        raise ValueError(f"budget applies to precision='auto' only, got precision={precision!r}")
    qc, kc, vc, descales = cast_inputs(q, k, v, precision)
    result = api.attention(qc, kc, vc, impl=impl, return_lse=return_lse, **descales, **options)
    out, lse = result if return_lse else (result, None)
    out = out.astype(q.dtype, copy=False)
    return (out, lse) if return_lse else out


def precision_attention(precision, impl="flash_numpy", budget=None):
    """A function ``attn(q, k, v, **options)`` that is ``attention_at(precision, ...)``: a drop-in
    for ``course_lib.attention`` in a model whose attention precision is to change."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return partial(attention_at, precision, impl=impl, budget=budget)


class AutoAttention:
    """``precision="auto"`` that keeps what it chose: a drop-in for ``course_lib.attention`` whose
    ``choices`` list holds every call's ``fallback.Choice`` (precision, reason, predicted errors),
    in call order, so a model's run can say which precision each layer and step ran in, and why."""

    def __init__(self, budget, impl="flash_numpy", **policy):
        if not (budget > 0):
            raise ValueError(f"budget must be a positive error bound, got {budget!r}")
        self.budget, self.impl, self.policy = budget, impl, policy
        self.choices = []

    def __call__(self, q, k, v, *, return_lse=False, **options):
        from .fallback import choose_precision
        choice = choose_precision(q, k, v, self.budget, **self.policy)
        self.choices.append(choice)
        return attention_at(choice.precision, q, k, v, impl=self.impl, return_lse=return_lse, **options)
