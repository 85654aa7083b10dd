"""The low-precision formats, and the scales that make float8 usable.

A float format is a sign, an exponent and a few significant bits.  What a
learner needs from each is four numbers (``FORMATS``): the largest finite
value (beyond it, numpy's cast gives inf, or NaN for e4m3fn, which has no
inf; the GPU's saturating conversion gives the largest value), the smallest
normal value (below it the spacing stops shrinking: subnormals, then 0), the
smallest subnormal, and the relative spacing 2**-(bits-1) of the significands.

float8 has so little range (e4m3fn: 2**-9 .. 448) that a tensor is stored as
``x8 = round(x / descale)`` with ``descale = amax / 448``, and the kernel
multiplies the descale back in (FlashAttention-3's ``q_descale``...).  Where
one descale serves (``quantize``'s ``granularity``):

- ``"tensor"``: one for the whole tensor; an outlier anywhere pushes every
  other value towards the subnormals;
- ``"head"``: one per (batch, K / V head), FA3's shape (batch, heads_k);
- ``"block"``: one per block of ``block`` rows of a head (finer still; the
  descale then varies along the sequence, which FA3's interface cannot take,
  so the error study alone uses it).

What happens past the largest value depends on who converts (``cast``).
numpy / ml_dtypes (and ``torch.Tensor.to``) do not saturate: past it a
value becomes inf, or NaN in e4m3fn, which has no inf.  The GPU's
conversion, PTX ``cvt.rn.satfinite.e4m3x2.f32`` (the instruction CUTLASS's
float-to-e4m3 converter emits, and FP8 KV caches quantise with), saturates:
a value past 448 becomes +-448, and only NaN stays NaN.

Incoherent processing (FA3, section 3.3): Q K^T = (Q M)(K M)^T for any
orthogonal M.  A random-sign Hadamard M spreads an outlier channel over all
D channels before quantising, so the amax and the descale shrink and the
small values keep their bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..core import rules
from ..core.reference import kv_head_index

GRANULARITIES = ("tensor", "head", "block")


@dataclass(frozen=True)
class Format:
    """One float format, from ``ml_dtypes.finfo``."""

    name: str
    bits: int               # significant bits, the implicit one included
    max: float              # largest finite value
    smallest_normal: float
    smallest_subnormal: float
    has_inf: bool

    @property
    def eps(self) -> float:
        """Relative spacing just above 1: 2**-(bits - 1); rounding errs by at most half of it."""
        return 2.0 ** -(self.bits - 1)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.name)


def _format(name) -> Format:
    info = ml_dtypes.finfo(np.dtype(name))
    return Format(name, int(info.nmant) + 1, float(info.max), float(info.smallest_normal),
                  float(info.smallest_subnormal), name != "float8_e4m3fn")


FORMATS = {name: _format(name) for name in ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")}


def fmt(dtype) -> Format:
    """The ``Format`` of a dtype or a name ("fp8", "bf16", ...)."""
    name = rules.dtype_name(dtype)
    if name not in FORMATS:
        raise ValueError(f"dtype must be one of {sorted(FORMATS)}, got {dtype!r}")
    return FORMATS[name]


def spacing(x, dtype) -> np.ndarray:
    """The distance from |x| to the next larger value of ``dtype`` (float64), for x in its range."""
    f = fmt(dtype)
    x = np.abs(np.asarray(x, dtype=np.float64))
    exponent = np.floor(np.log2(np.maximum(x, f.smallest_normal)))
    return 2.0 ** (exponent - (f.bits - 1))


def cast(x, dtype, *, saturate=False) -> np.ndarray:
    """x converted to ``dtype``.  ``saturate=False``: numpy's cast (ml_dtypes; torch's ``.to`` does the
    same): past the largest finite value, inf, or NaN where the format has no inf (e4m3fn).
    ``saturate=True``: the GPU's ``cvt.rn.satfinite``: clamped to +-max first (inf too); NaN stays NaN."""
    f = fmt(dtype)
    x = np.asarray(x)
    if saturate:
        x = np.clip(x, -f.max, f.max)   # every value past max rounds to max either way, so clamp first
    with np.errstate(over="ignore"):
        return x.astype(f.dtype)


def round_trip(x, dtype) -> np.ndarray:
    """x rounded to ``dtype`` and back to float64: what storing it costs."""
    return np.asarray(x).astype(fmt(dtype).dtype).astype(np.float64)


# -- scales --------------------------------------------------------------------------------

def amax(x, granularity="head", heads_k=None, block=128) -> np.ndarray:
    """The largest |x| per scale group of a (B, Hx, N, D) tensor.

    "tensor": shape (1, 1); "head": (B, heads_k), each group the query heads of
    one K / V head when x is q (heads_k < Hx); "block": (B, Hx, ceil(N / block)).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    a = np.abs(np.asarray(x, dtype=np.float64))
    B, Hx, N, _ = a.shape
    if granularity == "tensor":
        return np.full((1, 1), a.max(initial=0.0))
    if granularity == "head":
        heads_k = Hx if heads_k is None else heads_k
        per_head = a.max(axis=(2, 3), initial=0.0)                      # (B, Hx)
        group = kv_head_index(Hx, heads_k)
        return np.stack([per_head[:, group == g].max(axis=1) for g in range(heads_k)], axis=1)
    n_blocks = -(-N // block)
    padded = np.zeros((B, Hx, n_blocks * block, a.shape[3]))
    padded[:, :, :N] = a
    return padded.reshape(B, Hx, n_blocks, -1).max(axis=3)


def descale_for(amax_value, dtype="float8_e4m3fn", margin=1.0) -> np.ndarray:
    """descale = amax / (format max / margin), as float32; 1 where amax is 0 (nothing to scale)."""
    top = fmt(dtype).max / margin
    a = np.asarray(amax_value, dtype=np.float64)
    return np.where(a > 0, a / top, 1.0).astype(np.float32)


def _per_element(descale, shape, granularity, block):
    """A descale array broadcast to x's (B, Hx, N, D)."""
    B, Hx, N, _ = shape
    d = descale.astype(np.float64)
    if granularity == "tensor":
        return d[:, :, None, None]
    if granularity == "head":
        return d[:, kv_head_index(Hx, d.shape[1])][:, :, None, None]
    return np.repeat(d, block, axis=2)[:, :, :N, None]


def quantize(x, dtype="float8_e4m3fn", granularity="head", heads_k=None, block=128, descale=None, *,
             saturate=False):
    """(x8, descale): x / descale rounded to ``dtype``, and the descale that undoes it.

    The descale is ``descale_for(amax(x, granularity, heads_k, block))``
    unless one is given (delayed scaling: a descale from earlier data, which a
    larger amax now overflows: to NaN with numpy's cast, to +-448 with
    ``saturate=True``, the GPU's).  With ``granularity="head"`` the descale has
    FA3's shape (B, heads_k) and (x8, descale) go straight to
    ``course_lib.attention``.
    """
    x = np.asarray(x, dtype=np.float64)
    if descale is None:
        descale = descale_for(amax(x, granularity, heads_k, block), dtype)
    scaled = x / _per_element(descale, x.shape, granularity, block)
    return cast(scaled, dtype, saturate=saturate), descale


def dequantize(x8, descale, granularity="head", block=128) -> np.ndarray:
    """x8 times its descale, in float64."""
    return x8.astype(np.float64) * _per_element(np.asarray(descale), x8.shape, granularity, block)


def quantization_error(x, dtype="float8_e4m3fn", granularity="head", heads_k=None, block=128) -> dict:
    """How much of x survives quantising: the median relative error of an element (what a typical
    value loses; an outlier would dominate an RMS), the share flushed to zero, the share overflowed."""
    x = np.asarray(x, dtype=np.float64)
    x8, d = quantize(x, dtype, granularity, heads_k, block)
    back = dequantize(x8, d, granularity, block)
    finite = np.isfinite(back)
    nonzero = x != 0
    rel = np.abs(np.where(finite, back - x, np.inf)[nonzero]) / np.abs(x[nonzero])
    return {"median_rel": float(np.median(rel)) if rel.size else 0.0,
            "flushed": float(np.mean((back == 0) & nonzero)),
            "overflowed": float(np.mean(~finite))}


# -- incoherent processing ------------------------------------------------------------------

def hadamard(n: int) -> np.ndarray:
    """The n x n Hadamard matrix divided by sqrt(n) (orthogonal); n a power of two (Sylvester)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard transform needs a power-of-two head_dim, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def random_orthogonal(n: int, rng) -> np.ndarray:
    """A random-sign Hadamard transform, M = diag(signs) H: orthogonal, cheap (FA3's choice)."""
    return rng.choice([-1.0, 1.0], size=n)[:, None] * hadamard(n)


def incoherent(q, k, rng):
    """(Q M, K M) for a random orthogonal M: the same Q K^T, outliers spread over every channel."""
    m = random_orthogonal(q.shape[-1], rng)
    return np.asarray(q, dtype=np.float64) @ m, np.asarray(k, dtype=np.float64) @ m
