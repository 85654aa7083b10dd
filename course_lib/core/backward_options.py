"""What every backward impl may assume: validated (q, k, v, out, lse, dout) and options.

``call_backward(backward, q, k, v, out, lse, dout, **options)`` validates q, k,
v and the options exactly as the forward does (``core.options``), then what the
backward adds: out and dout of the forward's output shape and q's dtype, lse of
shape (B, H, Nq) and a float dtype, and the cheap signs that this lse does not
belong to this out under this mask:

- +inf anywhere (no forward gives it);
- a row the mask lets see no key must have lse = -inf and out = 0;
- a row that sees a key must not have lse = -inf (its gradient would be a
  silent zero);
- lse = -inf where out is not 0.

NaN in dout, out or lse is not an error: it reaches the gradients as NaN, as
in FlashAttention.  Then it runs ``backward(q, k, v, out, lse, dout, opts,
mask)`` and returns (dq, dk, dv) in q's dtype, shaped like q, k and v.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import rules
from .options import CALLS, _array, _check_heads, _check_representable, _cu_seqlens, _defaults, _options, _qkv


def _saved(name, x, shape, dtype):
    """out / dout: q's dtype, the forward's output shape."""
    _array(name, x)
    if x.shape != shape:
        raise ValueError(f"{name} must have the forward's output shape {shape}, got {x.shape}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have q's dtype {dtype}, got {x.dtype}")


def _lse(lse, shape):
    if not isinstance(lse, np.ndarray) or lse.dtype.kind != "f":
        raise TypeError(f"lse must be a float numpy array of shape {shape} (the forward's return_lse), got "
                        f"{lse.dtype if isinstance(lse, np.ndarray) else type(lse).__name__}")
    if lse.shape != shape:
        raise ValueError(f"lse must have shape {shape} (batch, heads, seqlen_q), got {lse.shape}")


def _lse_belongs(lse, out, mask, where=""):
    """The cheap cases of an lse that is not this out's under this mask (lse: (B, H, Nq), out: (B, H, Nq, Dv))."""
    if np.any(np.isposinf(lse)):
        raise ValueError(f"lse{where} holds +inf: no forward returns that; pass the lse of this out")
    lo, hi = mask.key_bounds(np.arange(mask.seqlen_q))
    blind = (np.maximum(lo, 0) > np.minimum(hi, mask.seqlen_k - 1))        # rows that see no key
    empty_rows = np.isneginf(lse)
    if np.any(np.isfinite(lse) & blind):
        raise ValueError(f"lse{where} is finite on a query row that sees no key under this mask; "
                         "pass the lse the forward returned with the same options")
    if np.any(empty_rows & ~blind):
        raise ValueError(f"lse{where} is -inf on a query row that sees keys under this mask (its gradient "
                         "would silently be 0); pass the lse the forward returned with the same options")
    with np.errstate(invalid="ignore"):
        nonzero = np.any(out != 0, axis=-1)
    if np.any(empty_rows & nonzero):
        raise ValueError(f"lse{where} is -inf on a row whose out is not 0: this lse is not this out's")


def _no_fp8(dtype):
    if rules.is_fp8(dtype):
        raise TypeError("the backward takes no float8_e4m3fn inputs (the course has no fp8 backward, and one "
                        "without descales would be silently wrong): dequantise q, k and v (value times its "
                        "descale), run the forward and the backward in bfloat16, float16 or float32")


def _run(backward, q, k, v, out, lse, dout, opts):
    B, H, Nq, _ = q.shape
    mask = opts.mask(Nq, k.shape[2])
    _lse_belongs(lse, out, mask)
    if B * H * Nq == 0 or k.shape[2] == 0 or k.shape[1] == 0:
        return np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    with CALLS:
        return backward(q, k, v, out, lse, dout, opts, mask)


def call_backward(backward, q, k, v, out, lse, dout, **options):
    """Validate a dense backward call, then run ``backward(q, k, v, out, lse, dout, opts, mask)``."""
    _qkv(q, k, v, 4, "(batch, heads, seqlen, head_dim)")
    _no_fp8(q.dtype)
    batch, heads, seqlen_q, head_dim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must have one batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have one seqlen_k, got {k.shape[2]} and {v.shape[2]}")
    _check_heads(heads, k.shape[1], head_dim, k.shape[3], v.shape[1])
    out_shape = (batch, heads, seqlen_q, v.shape[3])
    _saved("out", out, out_shape, q.dtype)
    _saved("dout", dout, out_shape, q.dtype)
    _lse(lse, (batch, heads, seqlen_q))
    opts = _options(batch=batch, heads=heads, head_dim=head_dim, return_lse=False, **_defaults(options))
    _check_representable(opts, q.dtype)
    return _run(backward, q, k, v, out, lse, dout, opts)


def call_backward_varlen(backward, q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, **options):
    """``call_backward`` for packed sequences (``attention_varlen``'s layout): one dense call per sequence.

    q, out, dout: (total_q, H, D[v]); k, v: (total_k, Hk, D[v]); lse: (H, total_q)."""
    _qkv(q, k, v, 3, "(total, heads, head_dim)")
    _no_fp8(q.dtype)
    total_q, heads, head_dim = q.shape
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have one packed length, got {k.shape[0]} and {v.shape[0]}")
    _check_heads(heads, k.shape[1], head_dim, k.shape[2], v.shape[1])
    out_shape = (total_q, heads, v.shape[2])
    _saved("out", out, out_shape, q.dtype)
    _saved("dout", dout, out_shape, q.dtype)
    _lse(lse, (heads, total_q))
    cq = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q)
    ck = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if cq.size != ck.size:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe one batch, got "
                         f"{cq.size - 1} and {ck.size - 1} sequences")
    batch = cq.size - 1
    opts = _options(batch=batch, heads=heads, head_dim=head_dim, return_lse=False, **_defaults(options))
    _check_representable(opts, q.dtype)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(batch):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        # (n, H, D) -> (1, H, n, D): one sequence as a dense batch of one
        dense = [x[None].transpose(0, 2, 1, 3) for x in (q[rows], k[keys], v[keys], out[rows], dout[rows])]
        seq_opts = opts if opts.alibi_slopes is None else replace(opts, alibi_slopes=opts.alibi_slopes[b:b + 1])
        qb, kb, vb, ob, dob = dense
        grads = _run(backward, qb, kb, vb, ob, lse[None, :, rows], dob, seq_opts)
        dq[rows], dk[keys], dv[keys] = (g[0].transpose(1, 0, 2) for g in grads)
    return dq, dk, dv
