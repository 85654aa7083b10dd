"""The error study: where low precision's error comes from, and how it grows.

``emulate`` is the tiled forward (FA2 loop order over key tiles, one query
tile) in float64 with each rounding of a low-precision kernel as a switch
(``Recipe``):

- ``inputs``: Q, K, V stored in a format (float8 with per-(batch, head)
  descales, as FA3 takes them, or float16 / bfloat16);
- ``p``: P = exp(S - m) rounded to a format before P V (l sums the
  unrounded P, as every kernel of the course does);
- ``p_shift``: P scaled by 2**p_shift before that rounding.  FA3's fp8
  forward subtracts ``Max_offset = 8`` from the row max in log2 space before
  ``exp2`` (``hopper/softmax.h``, ``scale_apply_exp2``), so its P lies in
  [0, 256] instead of [0, 1] and uses more of e4m3's range: an entry flushes
  to 0 below 2**-18 of the row max instead of 2**-10.  O and l both carry the
  factor, so out = O / l needs no correction; lse does (FA3's ``finalize``
  divides the row sum by 2**8 before its log);
- ``acc``: the running O and l kept in a format between key tiles, a coarse
  model of an accumulator narrower than float32 (Hopper's FP8 matmul is
  reported to keep about 14 bits while it accumulates: DeepSeek-V3 technical
  report, arXiv:2412.19437, section 3.3.2; here it is float16's 11).

Everything else is float64, so a recipe with one switch on measures that
source alone; ``RECIPES`` holds the real kernels' recipes (fp8 as FA3 runs it,
P shifted by 2**8; fp8 with P in [0, 1], as the course's kernels run it; fp16
and bf16 as FA2 does) and ``SOURCES`` the one-switch ones.

Quality, not only max error: ``row_kl`` is the KL divergence from the exact
attention row to the one the low-precision kernel applies (``weights``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .formats import FORMATS, dequantize, quantize, round_trip


@dataclass(frozen=True)
class Recipe:
    """Which roundings are switched on (a dtype name each, or None for exact)."""

    inputs: str | None = None
    p: str | None = None
    acc: str | None = None
    granularity: str = "head"   # the descales of float8 inputs
    p_shift: int = 0            # P = 2**p_shift exp(S - m) before it is rounded (FA3's fp8: 8)

    @property
    def label(self) -> str:
        p = None if self.p is None else self.p + (f" x 2^{self.p_shift}" if self.p_shift else "")
        parts = [f"{what} {dtype}" for what, dtype in (("inputs", self.inputs), ("P", p), ("acc", self.acc))
                 if dtype is not None]
        return ", ".join(parts) or "exact"


FA3_MAX_OFFSET = 8   # hopper/softmax.h: Softmax<..., Max_offset> is 8 for fp8, 0 otherwise

RECIPES = {
    "fp8 FA3": Recipe("float8_e4m3fn", "float8_e4m3fn", p_shift=FA3_MAX_OFFSET),   # FA3's FP8 forward
    "fp8": Recipe("float8_e4m3fn", "float8_e4m3fn"),     # P in [0, 1]: the course's kernels, the contrast
    "fp16": Recipe("float16", "float16"),                # FA2 / FA3 in float16
    "bf16": Recipe("bfloat16", "bfloat16"),
}
SOURCES = {
    "fp8 inputs alone": Recipe(inputs="float8_e4m3fn"),
    "fp8 P alone": Recipe(p="float8_e4m3fn"),
    "fp8 FA3 P alone": Recipe(p="float8_e4m3fn", p_shift=FA3_MAX_OFFSET),
    "fp16 accumulator alone": Recipe(acc="float16"),
    "fp16 inputs alone": Recipe(inputs="float16"),
    "fp16 P alone": Recipe(p="float16"),
}


def store_inputs(q, k, v, recipe: Recipe):
    """Q, K, V as the recipe stores them, back in float64 (float8: quantised with descales)."""
    if recipe.inputs is None:
        return q, k, v
    if recipe.inputs.startswith("float8"):
        back = []
        for x in (q, k, v):
            x8, d = quantize(x, recipe.inputs, recipe.granularity)
            back.append(dequantize(x8, d, recipe.granularity))
        return tuple(back)
    return tuple(round_trip(x, recipe.inputs) for x in (q, k, v))


def flush_below(recipe: Recipe) -> float:
    """The share of the row max below which an entry of exp(S - m) rounds to 0 in the recipe's P:
    half the format's smallest subnormal (ties go to the even 0), over 2**p_shift."""
    if recipe.p is None:
        return 0.0
    return FORMATS[recipe.p].smallest_subnormal / 2 / 2.0 ** recipe.p_shift


def _round(x, dtype):
    return x if dtype is None else round_trip(x, dtype)


def emulate(q, k, v, recipe: Recipe = Recipe(), *, softmax_scale=None, block_k=128):
    """(out, lse) of one recipe: q (B, H, Nq, D), k / v (B, H, Nk, D[v]), float64, no mask."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    q, k, v = store_inputs(q, k, v, recipe)
    B, H, Nq, _ = q.shape
    shift = 2.0 ** recipe.p_shift
    m = np.full((B, H, Nq, 1), -np.inf)
    l = np.zeros((B, H, Nq, 1))
    O = np.zeros((B, H, Nq, v.shape[-1]))
    for c0 in range(0, k.shape[2], block_k):
        s = scale * q @ np.swapaxes(k[:, :, c0:c0 + block_k], -1, -2)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = np.exp(m - m_new)
        p = shift * np.exp(s - m_new)
        l = _round(alpha * l + p.sum(axis=-1, keepdims=True), recipe.acc)
        O = _round(alpha * O + _round(p, recipe.p) @ v[:, :, c0:c0 + block_k], recipe.acc)
        m = m_new
    return O / l, (m + np.log(l / shift))[..., 0]


def weights(q, k, recipe: Recipe = Recipe(), *, softmax_scale=None):
    """The attention rows the recipe applies to V: round(2**p_shift exp(S - m)) / l, (B, H, Nq, Nk), float64."""
    q, k, _ = store_inputs(np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(k, np.float64), recipe)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    p = 2.0 ** recipe.p_shift * np.exp(s - s.max(axis=-1, keepdims=True))
    return _round(p, recipe.p) / p.sum(axis=-1, keepdims=True)


def row_kl(p, w) -> np.ndarray:
    """KL(p || w) per row, in nats: w renormalised (its rows need not sum to 1 once P is rounded);
    a weight rounded to 0 where p is not costs what p(log p - log tiny) says, never inf."""
    w = w / w.sum(axis=-1, keepdims=True)
    tiny = np.finfo(np.float64).tiny
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(np.maximum(w, tiny))), 0.0)
    return terms.sum(axis=-1)


def errors(out, lse, ref_out, ref_lse) -> dict:
    """Max abs error of out and lse, and out's RMS error relative to its RMS, all float64."""
    d = np.asarray(out, np.float64) - ref_out
    return {"out_max": float(np.abs(d).max()), "lse_max": float(np.abs(np.asarray(lse, np.float64) - ref_lse).max()),
            "out_rel_rms": float(np.sqrt(np.mean(d ** 2) / np.mean(ref_out ** 2)))}


# -- the inputs the study sweeps over ---------------------------------------------------------

def study_inputs(rng, *, seqlen_k, seqlen_q=64, head_dim=64, heads=1, logit_scale=1.0, outlier=1.0,
                 outlier_channels=1):
    """Gaussian q, k, v (1, heads, n, head_dim) float64.

    ``logit_scale`` multiplies q (a temperature below 1: sharper rows);
    ``outlier`` multiplies the first ``outlier_channels`` channels of K, the
    pattern that LLM keys show (a few channels far larger than the rest).
    """
    q = rng.standard_normal((1, heads, seqlen_q, head_dim)) * logit_scale
    k = rng.standard_normal((1, heads, seqlen_k, head_dim))
    k[..., :outlier_channels] *= outlier
    v = rng.standard_normal((1, heads, seqlen_k, head_dim))
    return q, k, v


def measure(q, k, v, recipes: dict, *, block_k=128) -> dict:
    """name -> errors of each recipe against the exact forward on the same inputs."""
    ref_out, ref_lse = emulate(q, k, v, Recipe(), block_k=block_k)
    result = {}
    for name, recipe in recipes.items():
        out, lse = emulate(q, k, v, recipe, block_k=block_k)
        result[name] = errors(out, lse, ref_out, ref_lse)
    return result
