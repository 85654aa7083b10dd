"""``attention``, ``attention_varlen`` and ``available_impls``: the course's public API.

Each looks the impl up in the registry (``kernels``) and runs it through
``core.options.call_forward``, which validates every input and option first.
"""
from __future__ import annotations

from . import kernels
from .core.backward_options import call_backward, call_backward_varlen
from .core.options import call_forward, call_forward_varlen


def available_impls() -> list:
    """Names of the impls usable on this machine, in the course's order."""
    return [name for name in kernels.IMPLS if kernels.load(name) is not None]


def _impl(impl):
    """The ``attention_forward`` of impl ``impl``."""
    if not isinstance(impl, str) or impl not in kernels.IMPLS:
        raise ValueError(f"impl must be one of {list(kernels.IMPLS)}, got {impl!r}")
    forward = kernels.load(impl)
    if forward is None:
        raise ValueError(f"impl {impl!r} is not available on this machine; available: {available_impls()}")
    return forward


# -- the public functions -------------------------------------------------------

def attention(q, k, v, *, impl="reference", causal=False, causal_align="bottom_right",
              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
              block_q=None, block_k=None, return_lse=False, q_descale=None, k_descale=None, v_descale=None):
    """Scaled dot-product attention with FlashAttention 2.1+ semantics.

    q: (batch, heads, seqlen_q, head_dim); k: (batch, heads_k, seqlen_k, head_dim);
    v: (batch, heads_k, seqlen_k, head_dim_v), heads % heads_k == 0.
    Returns out (batch, heads, seqlen_q, head_dim_v) in q's dtype, and with
    ``return_lse`` also lse (batch, heads, seqlen_q), natural log.

    ``block_q`` / ``block_k`` are honoured by every CPU impl.  Two kinds of impl
    cannot take any size: the tensor-core impls (``cuda_mma_*``) run warps of 16
    query rows on key tiles their tiling fixes, so they refuse both and take
    ``tiling=MmaTiling(...)`` through ``kernels.tensor_cores``; ``flash_numba_cuda``
    keeps its K and V tiles in 48 KB of static shared memory, so a ``block_k`` that
    does not fit (128 at head dim 59) is refused, naming the largest that does.

    float8_e4m3fn inputs (FlashAttention-3's FP8 forward; impls reference,
    naive, flash_numpy and the flash_numba_cpu steps) need ``q_descale``, ``k_descale`` and
    ``v_descale``, each (batch, heads_k): a value is its float8 value times its
    descale.  S and the softmax are float32, P is rounded to e4m3 before P V,
    and out is float32 (``core.rules.out_dtype``).
    """
    return call_forward(_impl(impl), q, k, v, causal=causal,
                        causal_align=causal_align, window_size=window_size, softcap=softcap,
                        alibi_slopes=alibi_slopes, softmax_scale=softmax_scale,
                        block_q=block_q, block_k=block_k, return_lse=return_lse,
                        **{name: x for name, x in (("q_descale", q_descale), ("k_descale", k_descale),
                                                   ("v_descale", v_descale)) if x is not None})


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, impl="reference", causal=False,
                     causal_align="bottom_right", window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, softmax_scale=None, block_q=None, block_k=None,
                     return_lse=False):
    """Attention over a packed batch of sequences of different lengths.

    q: (total_q, heads, head_dim), k / v: (total_k, heads_k, head_dim[_v]);
    sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v, and its mask is aligned on
    its own lengths.  Returns out (total_q, heads, head_dim_v) and, with
    ``return_lse``, lse (heads, total_q).
    """
    return call_forward_varlen(_impl(impl), q, k, v, cu_seqlens_q, cu_seqlens_k,
                               causal=causal, causal_align=causal_align, window_size=window_size,
                               softcap=softcap, alibi_slopes=alibi_slopes, softmax_scale=softmax_scale,
                               block_q=block_q, block_k=block_k, return_lse=return_lse)


# -- the backward pass (chapter 12) ------------------------------------------------

def available_backward_impls() -> list:
    """Names of the backward impls usable on this machine, in the course's order."""
    return [name for name in kernels.BACKWARD_IMPLS if kernels.load(name, kernels.BACKWARD_IMPLS) is not None]


def _backward_impl(impl):
    if not isinstance(impl, str) or impl not in kernels.BACKWARD_IMPLS:
        raise ValueError(f"impl must be one of {list(kernels.BACKWARD_IMPLS)}, got {impl!r}")
    backward = kernels.load(impl, kernels.BACKWARD_IMPLS)
    if backward is None:
        raise ValueError(f"backward impl {impl!r} is not available on this machine; "
                         f"available: {available_backward_impls()}")
    return backward


def attention_backward(q, k, v, out, lse, dout, *, impl="flash_numpy", causal=False,
                       causal_align="bottom_right", window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                       softmax_scale=None, block_q=None, block_k=None):
    """Gradients (dq, dk, dv) of attention, given its forward's ``out`` and ``lse`` and dL/dout.

    q, k, v and the options are those of the ``attention(..., return_lse=True)`` call that gave
    out (batch, heads, seqlen_q, head_dim_v) and lse (batch, heads, seqlen_q); dout is shaped and
    typed like out.  Returns dq, dk, dv shaped like q, k, v, in q's dtype (float32 accumulation
    at low precision); dk and dv are summed over the query heads of each K / V head (GQA / MQA).
    """
    return call_backward(_backward_impl(impl), q, k, v, out, lse, dout, causal=causal,
                         causal_align=causal_align, window_size=window_size, softcap=softcap,
                         alibi_slopes=alibi_slopes, softmax_scale=softmax_scale,
                         block_q=block_q, block_k=block_k)


def attention_backward_varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *, impl="flash_numpy",
                              causal=False, causal_align="bottom_right", window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, softmax_scale=None, block_q=None, block_k=None):
    """``attention_backward`` for ``attention_varlen``'s packed layout: q, out, dout (total_q, H, D[v]),
    k, v (total_k, Hk, D[v]), lse (H, total_q).  Returns (dq, dk, dv) packed like q, k, v."""
    return call_backward_varlen(_backward_impl(impl), q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k,
                                causal=causal, causal_align=causal_align, window_size=window_size,
                                softcap=softcap, alibi_slopes=alibi_slopes, softmax_scale=softmax_scale,
                                block_q=block_q, block_k=block_k)
