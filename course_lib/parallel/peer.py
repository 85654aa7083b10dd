"""PyTorch's own attention as the peer of a rank's partial: the same (out, lse) from torch SDPA's kernels.

``impl="torch_sdpa"`` in ``shard_attention.local_partial`` lands here, with the
keys and mask options ``mask_call`` chose.  Torch knows only top-left causal
(``is_causal``: j <= i), so the two masks the course's layouts need become:

    window (-1, 0) on a square block     is_causal on the block
    bottom-right causal with keys < rows the last ``keys`` rows, is_causal on them;
                                         the rows before them see nothing

It runs on the rank's GPU when there is one (the memory-efficient kernel,
which returns lse in float32 too), else on the CPU (torch's flash kernel for
the CPU); host arrays in, host arrays out.
"""
from __future__ import annotations

import numpy as np

from ..core.rules import lse_dtype


def _torch_partial(q, k, v, causal, scale):
    import torch
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in (q, k, v))
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            tq, tk, tv, None, True, 0.0, causal, scale=scale)[:2]
        lse = lse[:, :, :q.shape[2]]   # the kernel pads lse's rows to a multiple of 32
    else:
        tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(tq, tk, tv, 0.0, causal,
                                                                             scale=scale)[:2]
    return out.cpu().numpy(), lse.cpu().numpy()


def sdpa_partial(q, k, v, options, scale):
    """(out, lse) of q (B, H, nq, D) over k, v (all their keys) with ``mask_call``'s options."""
    if k.shape[1] != q.shape[1]:   # the peer's kernels want one K/V head per query head
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    nq, nk = q.shape[2], k.shape[2]
    out = np.zeros(q.shape[:3] + (v.shape[3],), dtype=q.dtype)
    lse = np.full(q.shape[:3], -np.inf, dtype=lse_dtype(q.dtype))
    if not options:
        rows, causal = slice(0, nq), False
    elif options == {"window_size": (-1, 0)} and nq == nk:
        rows, causal = slice(0, nq), True
    elif options.get("causal") and options.get("causal_align") == "bottom_right" and nk <= nq:
        rows, causal = slice(nq - nk, nq), True
    else:
        raise ValueError(f"the torch peer has no mask for {options} on a {nq} x {nk} block")
    o, s = _torch_partial(q[:, :, rows], k, v, causal, scale)
    out[:, :, rows], lse[:, :, rows] = o, s
    return out, lse
