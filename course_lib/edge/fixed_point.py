"""Attention the way an int8 NPU runs it: integer scores, a table for exp, integers for P V.

An NPU's MAC array multiplies int8 by int8 and adds into int32; it has no
float exp.  So, for one head:

    quantise     q8 = round(q / sq), sq = max|q| / 127 (the same for k, v)   int8
    scores       S32 = q8 k8^T, int32 accumulation (|S32| <= D 127^2: no overflow below D = 133,000)
    requantise   y = (S32 - rowmax) * sq sk scale log2(e), as a fixed-point number with
                 ``FRAC`` fraction bits: y <= 0 in log2 units
    exp          2^y = 2^-n 2^-f (integer part n, fraction f): 2^-f from a table of
                 ``2^lut_bits`` entries, 2^-n a right shift.  P in Q16 (1.0 = 65536)
    P V          p8 = P >> 8 (uint8, 0..255), O32 = p8 v8 and l = sum p8, int32
    finish       O = O32 / l * sv                                             (one float divide per row)

``attention_int8`` runs exactly that; ``attention_fp8`` quantises q, k, v to
float8 e4m3 with a per-tensor scale (ml_dtypes) and does the rest in float32;
``error_study`` puts both beside float64.

Without a matrix unit the same product is a loop: ``int8_scores_loop`` is what a
ported GPU kernel becomes on a core with no MMA instruction, one multiply-add
per (row, key, dim), and what a compiler makes of it depends on the core's
vector unit (``benchmarks/edge_int8.py`` compiles it with and without
vectorisation).
"""
from __future__ import annotations

import math

import ml_dtypes
import numba
import numpy as np

from ..api import attention

FRAC = 12  # fraction bits of the requantised scores y
Q16 = 16  # fraction bits of P
LOG2E = 1 / math.log(2)
E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448


def quantize_int8(x):
    """(x8, scale): symmetric per-tensor int8, x ~= x8 * scale."""
    x = np.asarray(x, np.float64)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    scale = amax / 127 if amax > 0 else 1.0
    return np.clip(np.rint(x / scale), -127, 127).astype(np.int8), scale


def scores_int8(q8, k8):
    """S32 = q8 k8^T, accumulated in int32 (what the MAC array produces)."""
    return q8.astype(np.int32) @ k8.astype(np.int32).T


def exp2_table(lut_bits: int) -> np.ndarray:
    """2^(-i / 2^lut_bits) in Q16, for i = 0 .. 2^lut_bits - 1 (entry 0 is 1.0 = 65536)."""
    i = np.arange(2 ** lut_bits)
    return np.rint(2.0 ** (-i / 2 ** lut_bits) * 2 ** Q16).astype(np.int64)


def exp2_fixed(y, lut_bits: int = 8):
    """2^y in Q16 for y <= 0 given in fixed point with ``FRAC`` fraction bits (int64), by table and shift.

    The fraction keeps its top ``lut_bits`` bits (truncated), so the relative error is below
    2^(2^-lut_bits) - 1 plus the Q16 rounding.
    """
    y = np.asarray(y, np.int64)
    if np.any(y > 0):
        raise ValueError("exp2_fixed takes y <= 0 (scores minus their row max)")
    neg = -y
    n, f = neg >> FRAC, neg & ((1 << FRAC) - 1)
    table = exp2_table(lut_bits)
    return np.where(n < 63, table[f >> (FRAC - lut_bits)] >> np.minimum(n, 62), 0)


def attention_int8(q, k, v, *, lut_bits: int = 8, p_bits: int = 8, scale=None):
    """One head (Nq, D), (Nk, D), (Nk, Dv) through the int8 pipeline of the module docstring; float64 out.

    ``p_bits=8`` feeds P V with uint8 P (an int8 MAC array); ``p_bits=16`` keeps P in Q16 and
    accumulates in int64, which isolates the error of the table from that of P's rounding.
    """
    q8, sq = quantize_int8(q)
    k8, sk = quantize_int8(k)
    v8, sv = quantize_int8(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s32 = scores_int8(q8, k8)
    multiplier = int(round(sq * sk * scale * LOG2E * 2 ** (FRAC + 16)))  # one integer multiplier, then a shift
    y = ((s32 - s32.max(axis=-1, keepdims=True)).astype(np.int64) * multiplier) >> 16
    p = exp2_fixed(y, lut_bits)
    if p_bits == 8:
        p = np.minimum(p >> 8, 255)
    elif p_bits != 16:
        raise ValueError(f"p_bits must be 8 or 16, got {p_bits!r}")
    o = p @ v8.astype(np.int64)
    return o / p.sum(axis=-1, keepdims=True) * sv


def attention_int8_scores(q, k, v, *, scale=None):
    """Only the scores in int8 (int32 accumulation); softmax and P V in float64: the first stage's error."""
    (q8, sq), (k8, sk) = quantize_int8(q), quantize_int8(k)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scores_int8(q8, k8) * (sq * sk * scale)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p @ np.asarray(v, np.float64) / p.sum(axis=-1, keepdims=True)


def to_e4m3(x):
    """(x in float8_e4m3fn, scale): a per-tensor scale that puts max|x| at e4m3's largest value, 448."""
    x = np.asarray(x, np.float64)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    scale = amax / E4M3_MAX if amax > 0 else 1.0
    return (x / scale).astype(ml_dtypes.float8_e4m3fn), scale


def attention_fp8(q, k, v, *, scale=None):
    """q, k, v quantised to float8 e4m3 (per-tensor scales), descaled, then float32 attention; float64 out."""
    (q8, sq), (k8, sk), (v8, sv) = to_e4m3(q), to_e4m3(k), to_e4m3(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q8.astype(np.float32) @ k8.astype(np.float32).T) * np.float32(sq * sk * scale)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p @ v8.astype(np.float32)) / p.sum(axis=-1, keepdims=True) * np.float32(sv)


def float64_attention(q, k, v):
    return attention(q[None, None], k[None, None], v[None, None])[0, 0]


def error_study(q, k, v, lut_bits=(4, 6, 8, 10)) -> dict:
    """Max abs error of the output against float64, one stage of the int8 pipeline at a time, and fp8 e4m3."""
    exact = float64_attention(q, k, v)
    err = lambda out: float(np.max(np.abs(out - exact)))
    rows = {"int8 scores, float softmax and P V": err(attention_int8_scores(q, k, v))}
    rows.update({f"+ {b}-bit exp table, Q16 P, int8 V": err(attention_int8(q, k, v, lut_bits=b, p_bits=16))
                 for b in lut_bits})
    rows["+ P in uint8 (8-bit table): all int8 / int32"] = err(attention_int8(q, k, v, lut_bits=8, p_bits=8))
    rows["fp8 e4m3 q, k, v (scaled), float32 softmax"] = err(attention_fp8(q, k, v))
    return rows


@numba.njit(nogil=True, cache=True)
def int8_scores_loop(q8, k8, out):
    """S32 = q8 k8^T as loops: one int32 multiply-add per (row, key, dim), no matrix unit."""
    for r in range(q8.shape[0]):
        for j in range(k8.shape[0]):
            acc = np.int32(0)
            for x in range(q8.shape[1]):
                acc += np.int32(q8[r, x]) * np.int32(k8[j, x])
            out[r, j] = acc
    return out


@numba.njit(nogil=True, cache=True)
def exp2_fixed_loop(y, table, lut_bits, out):
    """``exp2_fixed`` as the loop a core without a vector unit runs: one table read and one shift per score."""
    mask = (1 << FRAC) - 1
    for i in range(y.shape[0]):
        neg = -y[i]
        n = neg >> FRAC
        out[i] = table[(neg & mask) >> (FRAC - lut_bits)] >> n if n < 63 else 0
    return out
