"""When to fall back: choose fp8, fp16 or fp32 for one call from measured error budgets.

The policy (``choose_precision``), in order:

1. Inputs holding NaN or inf: fp32 (no scale holds them; let the float32
   kernel report them as the NaN rule says).
2. fp8 is refused when the descales a caller plans to use (delayed scaling,
   from earlier data) cannot hold today's amax: amax / descale that rounds
   past 448 (above 464, the midpoint to the step e4m3 lacks) is clipped to
   448 by the GPU's saturating conversion (``cvt.rn.satfinite``, what FP8 KV
   caches use), so the largest values lose 1 - 448 / (amax / descale) of
   themselves, more than any rounding of e4m3; numpy's cast (and torch's
   ``.to``) would make them NaN instead.
3. Otherwise each candidate, cheapest first (fp8, then fp16), is measured on
   a probe: ``probe_rows`` query rows spread over the sequence, against every
   key, through ``study.emulate`` with the kernel's recipe, against the exact
   forward.  The probe's largest error of out, times ``margin`` (the rows not
   probed may be worse than those probed), is the predicted error; the first
   candidate whose prediction is within ``budget`` wins.  fp16 is refused
   outright when an input exceeds float16's largest value (65504).
4. Nothing fits: fp32.

The probe measures what would go wrong instead of guessing it from amax
alone, so an outlier channel in K, a sharp (low-temperature) softmax and a
long row, which each fail fp8 in their own way, are all caught by one rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .formats import FORMATS, amax, cast
from .study import RECIPES, Recipe, emulate


@dataclass(frozen=True)
class Choice:
    """The precision chosen, why, and the predicted errors (max abs error of out) it was chosen on."""

    precision: str            # "fp8", "fp16" or "fp32"
    reason: str
    predicted: dict = field(default_factory=dict)

    def __str__(self):
        return f"{self.precision}: {self.reason}"


def probe_rows_of(seqlen_q, probe_rows):
    """The query rows a probe measures: ``probe_rows`` of them, evenly spread, first and last included."""
    return np.unique(np.linspace(0, seqlen_q - 1, min(probe_rows, seqlen_q)).astype(int))


def predicted_error(q, k, v, recipe: Recipe, probe_rows=64, margin=2.0) -> float:
    """margin x the largest error of out, against the exact forward, on the probe rows."""
    rows = probe_rows_of(q.shape[2], probe_rows)
    qp = np.asarray(q, np.float64)[:, :, rows]
    k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
    if k.shape[1] != qp.shape[1]:  # GQA: each query head against its K / V head
        group = qp.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    exact, _ = emulate(qp, k, v)
    out, _ = emulate(qp, k, v, recipe)
    err = np.abs(out - exact)
    return float(margin * err.max()) if np.all(np.isfinite(err)) else float("inf")


def _overflow(x, descale, heads_k):
    """(the worst amax / (448 x descale) of one input, whether it overflows e4m3).  It overflows
    when amax / descale rounds past 448, not merely when it passes 448: up to the rounding midpoint
    464 it still rounds to 448, so a descale computed from this very amax (rounded to float32,
    which may put the ratio a hair above 1) never counts as an overflow.  Past 464 numpy's
    non-saturating cast gives NaN, which is the test; the GPU's would clip to 448."""
    scaled = amax(x, "head", heads_k) / np.asarray(descale, np.float64)
    e4m3 = FORMATS["float8_e4m3fn"]
    return float(np.max(scaled) / e4m3.max), bool(np.isnan(cast(scaled, e4m3.name).astype(np.float64)).any())


def choose_precision(q, k, v, budget, *, descales=None, probe_rows=64, margin=2.0) -> Choice:
    """fp8, fp16 or fp32 for attention(q, k, v), the cheapest predicted within ``budget``
    (the largest absolute error of out accepted).  ``descales``: the (q, k, v) descales the
    caller would use for fp8 (delayed scaling), each (batch, heads_k); None: computed from these inputs."""
    if not (budget > 0):
        raise ValueError(f"budget must be a positive error bound, got {budget!r}")
    if not all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in (q, k, v)):
        return Choice("fp32", "the inputs hold NaN or inf, which no scale can hold")
    predicted = {}
    heads_k = k.shape[1]
    overflow = None
    if descales is not None:
        ratios = {name: _overflow(x, d, heads_k) for name, x, d in zip("qkv", (q, k, v), descales)}
        worst = max(ratios, key=lambda name: ratios[name][0])
        ratio, overflows = ratios[worst]
        if overflows:
            overflow = (f"{worst.upper()}'s amax is {ratio:.3g}x what its descale holds "
                        f"(448 x descale): fp8 would clip its largest values by {1 - 1 / ratio:.0%}")
    if overflow is None:
        predicted["fp8"] = predicted_error(q, k, v, RECIPES["fp8"], probe_rows, margin)
        if predicted["fp8"] <= budget:
            return Choice("fp8", f"predicted error {predicted['fp8']:.3g} is within the budget {budget:.3g}", predicted)
    too_big = max(float(np.max(np.abs(np.asarray(x, np.float64)))) for x in (q, k, v)) > FORMATS["float16"].max
    if not too_big:
        predicted["fp16"] = predicted_error(q, k, v, RECIPES["fp16"], probe_rows, margin)
        if predicted["fp16"] <= budget:
            why = overflow or f"fp8's predicted error {predicted['fp8']:.3g} exceeds the budget {budget:.3g}"
            return Choice("fp16", f"{why}; fp16's {predicted['fp16']:.3g} is within it", predicted)
    if too_big:
        return Choice("fp32", "an input exceeds float16's largest value (65504)", predicted)
    return Choice("fp32", f"neither fp8 nor fp16 is predicted within the budget {budget:.3g}", predicted)
