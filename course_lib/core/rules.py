"""The rules every kernel shares, written once, as plain scalar functions.

Each function takes and returns plain numbers and uses nothing but arithmetic,
comparisons and ``math``, so the same source runs as Python (the numpy code's
property tests call it directly), compiles with ``numba.njit`` (chapter 08's
CPU kernel) and with ``numba.cuda.jit(device=True)`` (chapter 09's GPU kernel).
No rule calls another rule: a compiler sees each one on its own, and a kernel
composes them.  The vectorised forms (``MaskSpec``, ``online_softmax``) are
built on these or held equal to them by property tests.  The precision rule
at the end (which dtype S, m, l, O and lse are kept in, when P is rounded,
the bytes of a dtype) is a set of host-side functions of a dtype, which every
kernel, model and check asks.

Positions.  Query ``i`` stands at key position ``i + offset``: ``offset`` is
``Nk - Nq`` for FlashAttention's bottom-right alignment, 0 for PyTorch's
top-left.  A window ``(left, right)`` lets it see keys
``i + offset - left <= j <= i + offset + right``; -1 is unbounded, and causal
is folded in beforehand as ``right = 0``.

The online-softmax state of one query row is ``(m, l)``: the largest score
seen and the sum of ``exp(s - m)`` over the scores seen.  A row that has seen
no key is ``(-inf, 0)`` and every rule here keeps it so without a NaN.  A NaN
score is never hidden: it reaches m, l and lse, so a NaN row reports lse =
NaN, never -inf (which would mean "saw no key").
"""
from __future__ import annotations

import math

import ml_dtypes  # noqa: F401  (bfloat16 and the float8 types, by name too)
import numpy as np

UNBOUNDED = -1  # a window side without a limit

# Tile kinds, as small ints a compiled kernel can branch on.
EMPTY = 0    # no query of the tile sees any key of it: skip it, load nothing
PARTIAL = 1  # some pairs are hidden: apply the mask element by element
FULL = 2     # every query sees every key: no elementwise mask at all
KIND_NAMES = {EMPTY: "empty", PARTIAL: "partial", FULL: "full"}

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453    # ln(2) = 1 / LOG2E: a max in log2 units times LN2 is back in natural units

try:
    exp2 = math.exp2          # 2**x: one ex2.approx instruction in a fastmath CUDA kernel
except AttributeError:        # Python 3.10 has no math.exp2 (the simulators run kernels as Python)
    def exp2(x):
        return 2.0 ** x


# -- masks --------------------------------------------------------------------------

def visible(i, j, offset, left, right):
    """May query row ``i`` see key ``j``?"""
    centre = i + offset
    if left >= 0 and j < centre - left:
        return False
    if right >= 0 and j > centre + right:
        return False
    return True


def tile_kind(q_start, q_stop, k_start, k_stop, offset, left, right):
    """EMPTY, PARTIAL or FULL for rows [q_start, q_stop) x keys [k_start, k_stop).

    Both key bounds grow with the row, so the tile's first and last rows decide:
    the tile is empty when the last row's window ends before the first key or
    the first row's begins after the last key, and full when the first row's
    window ends at or after the last key and the last row's begins at or
    before the first key.
    """
    if q_stop <= q_start or k_stop <= k_start:
        return EMPTY
    first, last = q_start + offset, q_stop - 1 + offset
    if right >= 0 and last + right < k_start:
        return EMPTY
    if left >= 0 and first - left > k_stop - 1:
        return EMPTY
    if (right < 0 or first + right >= k_stop - 1) and (left < 0 or last - left <= k_start):
        return FULL
    return PARTIAL


def alibi_distance(i, j, offset):
    """|i + offset - j|: ALiBi adds -slope times this to the score of (i, j)."""
    return abs(i + offset - j)


def alibi_anchor(i, offset, seqlen_k):
    """The key of row ``i`` that ALiBi's bias is rebased on: its diagonal ``i + offset`` moved into the keys
    [0, seqlen_k), the visible key nearest the diagonal (a window always holds the diagonal)."""
    anchor = i + offset
    if anchor > seqlen_k - 1:
        anchor = seqlen_k - 1
    if anchor < 0:
        anchor = 0
    return anchor


def alibi_rebased_distance(i, j, offset, seqlen_k):
    """|a - j|, a = ``alibi_anchor(i, offset, seqlen_k)``: what every kernel multiplies by -slope.

    It is ``alibi_distance`` less the row's own constant |i + offset - a| (for every key j in [0, seqlen_k)),
    which softmax does not see and lse takes back.  The bias itself reaches slope * (Nq - 1) where the
    diagonal runs past the keys (799 queries on 3 keys, slope 0.3: about 240, which float32 holds to 1.5e-5
    only); rebased it stays below slope * seqlen_k, and near the row's largest scores it is small.
    """
    anchor = i + offset
    if anchor > seqlen_k - 1:
        anchor = seqlen_k - 1
    if anchor < 0:
        anchor = 0
    return abs(anchor - j)


def softcap(s, cap):
    """cap * tanh(s / cap), Gemma-2's soft cap on a score; cap == 0 leaves it alone."""
    if cap > 0.0:
        return cap * math.tanh(s / cap)
    return s


def softcap_slope(t, cap):
    """d softcap(s) / ds written in the capped score t = softcap(s): 1 - (t / cap)**2
    (tanh' = 1 - tanh**2), so a backward that recomputed t needs no second tanh; 1 without a cap."""
    if cap > 0.0:
        return 1.0 - (t / cap) * (t / cap)
    return 1.0


# -- the online softmax of one row ------------------------------------------------------

def max_nan(a, b):
    """max(a, b) that lets a NaN through from either side (Python's max and
    numba's do not), so a NaN score reaches the row's m."""
    if a > b or a != a:
        return a
    return b


def shift_of(m):
    """What a row subtracts before exp: its max, or 0 for a row that has seen
    nothing (m = -inf), so that exp(-inf - shift) is 0 instead of a NaN."""
    if m == -math.inf:
        return 0.0
    return m


def rescale(m_old, m_new):
    """alpha = exp(m_old - m_new): what the sum and output kept so far are
    multiplied by when the row's max grows; 0 while nothing was seen."""
    if m_new == -math.inf:
        return 0.0
    return math.exp(m_old - m_new)


def rescale_exp2(m_old, m_new):
    """``rescale`` for a row kept in log2 units (chapter 10's kernels):
    alpha = 2**(m_old - m_new), 0 while nothing was seen."""
    if m_new == -math.inf:
        return 0.0
    return exp2(m_old - m_new)


def finalize(m, l):
    """(lse, 1 / l) at the end of a row: lse = m + log l, out = O / l.

    A row that saw no key (l == 0) gives lse = -inf and scale 0 (out = 0); a
    NaN in l (a NaN score) gives lse = NaN, never -inf.  The numpy kernels
    run the same rule on arrays: ``online_softmax.finalize``.
    """
    if l == 0.0:
        return -math.inf, 0.0
    return m + math.log(l), 1.0 / l


# -- precision ----------------------------------------------------------------------------
#
# The one precision rule of every kernel, model and check, as functions of the
# input dtype (a numpy dtype, a type, or a name such as "bf16").  Inputs and the
# output are in the input dtype.  S, the row statistics m and l, and the O
# accumulator are in ``acc_dtype``: float64 for float64 inputs, float32 for
# everything else.  At low precision P is rounded to the input dtype before
# P V (``p_round_dtype``), as a GPU's matrix unit takes its operands in that
# dtype.  lse is returned in ``lse_dtype``, the accumulation dtype.

# Bytes per element of each float dtype the course names: the kernels take the
# first four (``core.options`` checks), the models also count float8 tiles.
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
# Short names a learner may write for a dtype, and the name each stands for.
DTYPE_ALIASES = {"fp64": "float64", "fp32": "float32", "tf32": "tfloat32", "fp16": "float16", "half": "float16",
                 "bf16": "bfloat16", "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn"}
LOW_PRECISION = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
# Significant bits and the smallest exponent of a quantum (subnormals) of
# each low-precision format, for ``round_to_bits``.
ROUNDING = {"float16": (11, -24), "bfloat16": (8, -133), "float8_e4m3fn": (4, -9), "float8_e5m2": (3, -16)}


def dtype_name(dtype) -> str:
    """The canonical name of a dtype: "float16", "bfloat16", "float8_e4m3fn", ... ("bf16" -> "bfloat16")."""
    if isinstance(dtype, str):
        return DTYPE_ALIASES.get(dtype, dtype)
    return np.dtype(dtype).name


def itemsize(dtype) -> int:
    """Bytes per element of a float dtype (names, numpy and ml_dtypes types)."""
    name = dtype_name(dtype)
    if name not in ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(ITEMSIZE)}, got {dtype!r}")
    return ITEMSIZE[name]


def is_low_precision(dtype) -> bool:
    """float16, bfloat16 or a float8: a dtype the matrix units multiply, accumulating in float32."""
    return dtype_name(dtype) in LOW_PRECISION


def acc_dtype(dtype) -> np.dtype:
    """The dtype S, m, l and the O accumulator are kept in: float64 for float64 inputs, float32 otherwise."""
    return np.dtype(np.float64) if dtype_name(dtype) == "float64" else np.dtype(np.float32)


def p_round_dtype(dtype):
    """The dtype P is rounded to before P V: the input dtype at low precision, None for float32 / float64."""
    return np.dtype(dtype_name(dtype)) if is_low_precision(dtype) else None


def lse_dtype(dtype) -> type:
    """The dtype lse is returned in: the accumulation dtype."""
    return acc_dtype(dtype).type


def round_to_bits(x, bits, min_exponent):
    """x rounded to ``bits`` significant bits, half to even, with no quantum
    below 2**min_exponent: float16 is (11, -24), bfloat16 (8, -133).  What
    ``x.astype(float16).astype(float32)`` does, for the values P takes (0..1),
    in arithmetic that every compiler here accepts.  bits <= 0 leaves x alone.
    """
    if bits <= 0 or x == 0.0 or x != x or x == math.inf or x == -math.inf:
        return x
    mantissa, exponent = math.frexp(x)  # x = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
    quantum = exponent - bits
    if quantum < min_exponent:
        quantum = min_exponent
    return math.ldexp(float(round(math.ldexp(x, -quantum))), quantum)


# -- float8 inputs (FlashAttention-3's interface) -----------------------------------------
#
# q, k and v may come in float8_e4m3fn with a descale factor per (batch, K / V head):
# the real value of an element is its float8 value times its descale.  S and the
# online softmax are float32; P = exp(S - m) is rounded to e4m3 before P V, as
# FA3 feeds its FP8 matrix unit, and l sums the unrounded P; O is accumulated in
# float32 and returned in float32 (``out_dtype``), lse in float32.  FA3 returns
# bfloat16; float32 keeps the output's own rounding out of the error of fp8, and
# a caller who wants FA3's output converts it.

FP8_INPUT = "float8_e4m3fn"     # the one float8 format the kernels take as input
E4M3_MAX = 448.0                # the largest finite e4m3fn value (it has no inf)


def is_fp8(dtype) -> bool:
    """float8_e4m3fn: inputs that come with descales (``dtype_name`` of None is not fp8)."""
    return dtype is not None and dtype_name(dtype) == FP8_INPUT


def out_dtype(dtype) -> np.dtype:
    """The dtype attention returns for inputs of ``dtype``: float32 for float8 inputs, else the input dtype."""
    return np.dtype(np.float32) if is_fp8(dtype) else np.dtype(dtype_name(dtype))


def round_e4m3(x):
    """x rounded to float8_e4m3fn, as ``ml_dtypes`` does, returned as a float.

    Four significant bits, half to even, no quantum below 2**-9 (the
    subnormals); the format has no inf, so whatever rounds above 448 (or is
    inf or NaN) becomes NaN.  ``round_to_bits(x, 4, -9)`` is the same for the
    values P takes (0..1), which is how the kernels round P.
    """
    if x == 0.0 or x != x:
        return x
    if x == math.inf or x == -math.inf:
        return math.nan
    mantissa, exponent = math.frexp(x)
    quantum = exponent - 4
    if quantum < -9:
        quantum = -9
    y = math.ldexp(float(round(math.ldexp(x, -quantum))), quantum)
    if y > 448.0 or y < -448.0:
        return math.nan
    return y
