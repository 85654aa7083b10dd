"""The memory wall of naive attention: the model, and a measurement.

Naive attention writes the scores S = scale * Q K^T, one (Nq, Nk) matrix per
batch and head, before it can softmax them.  Q, K, V and O grow like N; S grows
like N^2, so for long sequences S is nearly all of the memory:

    bytes(S) = B * H * Nq * Nk * itemsize

``score_bytes`` is that model (itemsize from ``core.rules``), ``qkvo_bytes``
the linear part beside it, and ``peak_bytes`` measures what a function really
allocates at its peak on this machine (with ``tracemalloc``, which numpy
reports its array buffers to).
"""
from __future__ import annotations

import gc
import tracemalloc

from ..core import rules


def score_bytes(batch: int, heads: int, seqlen_q: int, seqlen_k: int | None = None,
                dtype="float32") -> int:
    """Bytes of S (batch, heads, seqlen_q, seqlen_k): the N^2 term."""
    seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
    return int(batch) * int(heads) * int(seqlen_q) * int(seqlen_k) * rules.itemsize(dtype)


def qkvo_bytes(batch: int, heads: int, seqlen: int, head_dim: int, dtype="float32",
               heads_k: int | None = None) -> int:
    """Bytes of Q, K, V and O (seqlen_q == seqlen_k): the linear term.

    With GQA / MQA only ``heads_k`` heads of K and V are stored.
    """
    heads_k = heads if heads_k is None else heads_k
    per_head = int(batch) * int(seqlen) * int(head_dim) * rules.itemsize(dtype)
    return per_head * (2 * int(heads) + 2 * int(heads_k))


def peak_bytes(fn, *args, **kwargs) -> int:
    """Peak bytes allocated while ``fn(*args, **kwargs)`` runs, above what was live before.

    Counts numpy array buffers and Python objects (``tracemalloc``); memory a
    library allocates outside Python's allocators (a BLAS workspace, a GPU)
    is not seen.  The result of ``fn`` is counted (it is allocated during the
    call) and then dropped.
    """
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - before)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': powers of 1024, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
