"""What every impl may assume: validated inputs and options, and empty shapes handled.

``call_forward(forward, q, k, v, **options)`` catches everything a learner can
get wrong in a call, before any impl runs, with an error that names the
argument, says what was expected and what was given; then it runs
``forward(q, k, v, opts, mask)`` on validated arrays and an
``AttentionOptions``.  ``course_lib.attention`` calls it with a registered
impl; a lecture calls it with any forward function (a loop-order variant, a
learner's kernel).  Nothing is modified in place.
"""
from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from . import rules
from .masks import ALIGNMENTS, MaskSpec

FLOAT_DTYPES = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
                np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.float8_e4m3fn)}
DESCALES = ("q_descale", "k_descale", "v_descale")


@dataclass(frozen=True)
class AttentionOptions:
    """Validated options, shared by every impl."""

    softmax_scale: float
    causal: bool = False
    causal_align: str = "bottom_right"
    window_size: tuple = (-1, -1)
    softcap: float = 0.0
    alibi_slopes: np.ndarray | None = None  # float64 (B, H), or None
    block_q: int | None = None
    block_k: int | None = None
    descale: tuple | None = None  # float8 inputs: (q, k, v) descales, float64 (B, Hk) each

    def mask(self, seqlen_q: int, seqlen_k: int) -> MaskSpec:
        return MaskSpec(seqlen_q, seqlen_k, self.causal, self.causal_align, self.window_size)


# -- validation ---------------------------------------------------------------

def _array(name, x):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain numpy array, got a masked array (its mask would be ignored); "
                        "pass x.filled(...) or a mask through causal / window_size")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32, float64 or float8_e4m3fn, got dtype {x.dtype}")
    return x


def _qkv(q, k, v, rank, layout):
    q, k, v = _array("q", q), _array("k", k), _array("v", v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got shape {x.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_heads(heads, heads_k, head_dim, k_head_dim, v_heads):
    if heads_k != v_heads:
        raise ValueError(f"k and v must have the same number of heads, got {heads_k} and {v_heads}")
    if head_dim < 1:
        raise ValueError(f"head_dim of q must be >= 1, got {head_dim}")
    if k_head_dim != head_dim:
        raise ValueError(f"k must have q's head_dim {head_dim}, got {k_head_dim}")
    if heads_k == 0 and heads > 0 or heads_k > 0 and heads % heads_k != 0:
        raise ValueError(f"heads of q ({heads}) must be a multiple of heads of k/v ({heads_k}) for GQA/MQA")


def _check_representable(opts, dtype):
    """softmax_scale, softcap and the largest ALiBi slope must survive the accumulation dtype (float32 for
    all but float64 inputs): 1e-50 would become 0 (a cap silently off), 1e39 infinity (NaN scores)."""
    acc = rules.acc_dtype(dtype)
    slopes = opts.alibi_slopes
    slope = float(np.max(np.abs(slopes))) if slopes is not None and slopes.size else 0.0
    for name, value in (("softmax_scale", opts.softmax_scale), ("softcap", opts.softcap), ("alibi_slopes", slope)):
        with np.errstate(over="ignore", under="ignore"):
            rounded = float(acc.type(value))
        if value != 0 and (rounded == 0 or not math.isfinite(rounded)):
            raise ValueError(f"{name} = {value:g} does not survive {acc.name}, the dtype {dtype} inputs are "
                             f"computed in (it becomes {rounded:g}); use a value within {acc.name}'s range")


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _options(*, batch, heads, head_dim, causal, causal_align, window_size, softcap,
             alibi_slopes, softmax_scale, block_q, block_k, return_lse):
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if causal_align not in ALIGNMENTS:
        raise ValueError(f"causal_align must be one of {ALIGNMENTS}, got {causal_align!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(_is_int(w) for w in window_size)):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    if any(w < -1 for w in window_size):
        raise ValueError(f"window_size entries must be >= 0, or -1 for unbounded, got {tuple(window_size)}")
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be a number, got {softcap!r}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be finite and >= 0 (0 turns it off), got {softcap}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    elif not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
        raise TypeError(f"softmax_scale must be a number or None, got {softmax_scale!r}")
    elif not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block is not None and not _is_int(block):
            raise TypeError(f"{name} must be a positive int or None, got {block!r}")
        if block is not None and block < 1:
            raise ValueError(f"{name} must be >= 1, got {block}")
    slopes = None
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, np.ndarray) or alibi_slopes.dtype.kind != "f":
            raise TypeError("alibi_slopes must be a float numpy array of shape (heads,) or (batch, heads)")
        if alibi_slopes.shape not in ((heads,), (batch, heads)):
            raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}), got {alibi_slopes.shape}")
        if not np.all(np.isfinite(alibi_slopes)):
            raise ValueError("alibi_slopes must be finite")
        slopes = np.broadcast_to(alibi_slopes.astype(np.float64), (batch, heads)).copy()
    return AttentionOptions(
        softmax_scale=float(softmax_scale), causal=bool(causal), causal_align=causal_align,
        window_size=(int(window_size[0]), int(window_size[1])), softcap=float(softcap),
        alibi_slopes=slopes, block_q=None if block_q is None else int(block_q),
        block_k=None if block_k is None else int(block_k))


def _descales(dtype, batch, heads_k, descales):
    """(q, k, v) descales as float64 (B, Hk) arrays for float8 inputs; None otherwise.

    FlashAttention-3's contract: float8_e4m3fn inputs need all three, each of
    shape (batch, heads_k), finite and > 0; other inputs take none."""
    given = [name for name in DESCALES if descales[name] is not None]
    if not rules.is_fp8(dtype):
        if given:
            raise TypeError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to float8_e4m3fn "
                            f"inputs only; q, k and v are {dtype}: leave them out, or quantise the inputs "
                            f"(course_lib.lowp.quantize)")
        return None
    out = []
    for name in DESCALES:
        x = descales[name]
        if x is None:
            raise TypeError(f"float8_e4m3fn inputs need {name}, a float array of shape ({batch}, {heads_k}) "
                            f"(batch, heads_k): the factor that turns the float8 values back into real ones")
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float numpy array of shape ({batch}, {heads_k}), got "
                            f"{x.dtype if isinstance(x, np.ndarray) else type(x).__name__}")
        if x.shape != (batch, heads_k):
            raise ValueError(f"{name} must have shape (batch, heads_k) = ({batch}, {heads_k}), got {x.shape}")
        x = x.astype(np.float64)
        if not np.all(np.isfinite(x) & (x > 0)):
            raise ValueError(f"{name} must be finite and > 0")
        with np.errstate(over="ignore", under="ignore"):
            rounded = x.astype(np.float32)
        if not np.all(np.isfinite(rounded) & (rounded > 0)):
            raise ValueError(f"{name} must be within float32's range, where float8 inputs are computed "
                             f"(max {float(np.max(x)):g}, min {float(np.min(x)):g}): it would become "
                             f"{'infinity' if not np.all(np.isfinite(rounded)) else '0'}")
        out.append(x)
    return tuple(out)


# -- running a forward ----------------------------------------------------------

# One call at a time: the compiled impls share process-wide state that two threads would corrupt
# (numba's workqueue threading layer aborts the process, the CUDA simulator's thread-local state breaks,
# and the save / restore of OpenBLAS's thread count around a call would keep BLAS on one thread).
CALLS = threading.RLock()


def _never_nan(out, q, k, v):
    """Finite inputs give a finite output, or the call is refused: a NaN here means the scores overflowed.
    (A forward that returns no array, such as a lecture's function that only plans a launch, is not checked.)"""
    if not isinstance(out, np.ndarray) or np.all(np.isfinite(out)):
        return out
    if all(np.all(np.isfinite(x)) for x in (q, k, v)):
        big = max(float(np.max(np.abs(x.astype(np.float64)))) for x in (q, k))
        raise ValueError(f"the scores overflowed {rules.acc_dtype(q.dtype).name} (max |q|, |k| = {big:g}): "
                         "q and k are too large for this impl's arithmetic; scale them down (and softmax_scale "
                         "up), or use an impl that computes in float64 (impl='reference')")
    return out


def _run(forward, q, k, v, opts):
    """Dense forward, handling shapes that leave no work for the impl, one call at a time."""
    with CALLS:
        out, lse = _run_unlocked(forward, q, k, v, opts)
    return _never_nan(out, q, k, v), lse


def _run_unlocked(forward, q, k, v, opts):
    batch, heads, seqlen_q, _ = q.shape
    seqlen_k, head_dim_v = k.shape[2], v.shape[3]
    if batch * heads * seqlen_q == 0 or seqlen_k == 0:
        # Nothing to compute, or no key to see: every row is fully masked.
        out = np.zeros((batch, heads, seqlen_q, head_dim_v), dtype=rules.out_dtype(q.dtype))
        lse = np.full((batch, heads, seqlen_q), -np.inf, dtype=rules.lse_dtype(q.dtype))
        return out, lse
    if head_dim_v == 0:
        # No output columns, but lse still sums over the keys each row sees: run on one zero column.
        _, lse = forward(q, k, np.zeros(v.shape[:3] + (1,), v.dtype), opts, opts.mask(seqlen_q, seqlen_k))
        return np.zeros((batch, heads, seqlen_q, 0), dtype=rules.out_dtype(q.dtype)), lse
    return forward(q, k, v, opts, opts.mask(seqlen_q, seqlen_k))


def call_forward(forward, q, k, v, *, return_lse=False, **options):
    """Validate a dense call, then run ``forward(q, k, v, opts, mask)``.

    ``attention`` uses it with a registered impl; a lecture can pass any
    forward function (a loop-order variant, a learner's kernel) and get the
    same checks and the same handling of empty shapes.
    """
    _qkv(q, k, v, 4, "(batch, heads, seqlen, head_dim)")
    batch, heads, seqlen_q, head_dim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must have one batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have one seqlen_k, got {k.shape[2]} and {v.shape[2]}")
    _check_heads(heads, k.shape[1], head_dim, k.shape[3], v.shape[1])
    descales = {name: options.pop(name, None) for name in DESCALES}
    opts = _options(batch=batch, heads=heads, head_dim=head_dim, return_lse=return_lse, **_defaults(options))
    opts = replace(opts, descale=_descales(q.dtype, batch, k.shape[1], descales))
    _check_representable(opts, q.dtype)
    out, lse = _run(forward, q, k, v, opts)
    return (out, lse) if return_lse else out


_OPTION_DEFAULTS = dict(causal=False, causal_align="bottom_right", window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, softmax_scale=None, block_q=None, block_k=None)


def attention_options(*, batch, heads, head_dim, **options) -> AttentionOptions:
    """Validated options, defaults filled in, for a problem of this batch, heads and head_dim:
    what ``call_forward`` hands an impl, for a lecture or a test that calls a kernel itself."""
    return _options(batch=batch, heads=heads, head_dim=head_dim, return_lse=False, **_defaults(options))


def _defaults(options):
    unknown = set(options) - set(_OPTION_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(_OPTION_DEFAULTS)}"
                        f" (and {', '.join(DESCALES)} for float8 inputs to a dense call)")
    return {**_OPTION_DEFAULTS, **options}


def _cu_seqlens(name, cu, total):
    if not isinstance(cu, np.ndarray) or cu.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an int numpy array, got "
                        f"{cu.dtype if isinstance(cu, np.ndarray) else type(cu).__name__}")
    if cu.ndim != 1 or cu.size < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    if np.any(np.diff(cu) < 0):
        raise ValueError(f"{name} must be non-decreasing, got {cu.tolist()}")
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total}, got {cu[-1]}")
    return cu.astype(np.int64)


def call_forward_varlen(forward, q, k, v, cu_seqlens_q, cu_seqlens_k, *, return_lse=False, **options):
    """``call_forward`` for packed sequences: one dense call per sequence."""
    _qkv(q, k, v, 3, "(total, heads, head_dim)")
    if rules.is_fp8(q.dtype):
        raise TypeError("attention_varlen takes no float8_e4m3fn inputs: call attention per sequence, "
                        "with q_descale, k_descale and v_descale")
    total_q, heads, head_dim = q.shape
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have one packed length, got {k.shape[0]} and {v.shape[0]}")
    _check_heads(heads, k.shape[1], head_dim, k.shape[2], v.shape[1])
    cq = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q)
    ck = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if cq.size != ck.size:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe one batch, got "
                         f"{cq.size - 1} and {ck.size - 1} sequences")
    batch = cq.size - 1
    opts = _options(batch=batch, heads=heads, head_dim=head_dim, return_lse=return_lse, **_defaults(options))
    _check_representable(opts, q.dtype)
    out = np.zeros((total_q, heads, v.shape[2]), dtype=q.dtype)
    lse = np.full((heads, total_q), -np.inf, dtype=rules.lse_dtype(q.dtype))
    for b in range(batch):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        # (n, H, D) -> (1, H, n, D): one sequence as a dense batch of one
        qb, kb, vb = (x[None].transpose(0, 2, 1, 3) for x in (q[rows], k[keys], v[keys]))
        seq_opts = opts if opts.alibi_slopes is None else replace(opts, alibi_slopes=opts.alibi_slopes[b:b + 1])
        ob, lb = _run(forward, qb, kb, vb, seq_opts)
        out[rows] = ob[0].transpose(1, 0, 2)
        lse[:, rows] = lb[0]
    return (out, lse) if return_lse else out

