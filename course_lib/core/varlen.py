"""Packing a ragged batch for ``attention_varlen``, and unpacking it again.

A padded batch wastes work on padding; FlashAttention's varlen layout instead
concatenates the sequences along the token axis, (total, heads, head_dim), and
describes where each starts with ``cu_seqlens`` = [0, n0, n0 + n1, ...].
"""
import numpy as np


def cu_seqlens(lengths) -> np.ndarray:
    """[0, n0, n0 + n1, ...] as int32, the cumulative sequence lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or np.any(lengths < 0):
        raise ValueError(f"lengths must be a 1-D list of non-negative ints, got {lengths.tolist()}")
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def pack(sequences):
    """List of (n_b, heads, dim) arrays -> (packed (total, heads, dim), cu_seqlens)."""
    sequences = [np.asarray(s) for s in sequences]
    if not sequences:
        raise ValueError("pack needs at least one sequence")
    trailing = {s.shape[1:] for s in sequences}
    if any(s.ndim != 3 for s in sequences) or len(trailing) != 1:
        raise ValueError(f"every sequence must be (n, heads, dim) with one (heads, dim), got "
                         f"{[s.shape for s in sequences]}")
    return np.concatenate(sequences, axis=0), cu_seqlens([len(s) for s in sequences])


def unpack(packed, cu):
    """(total, heads, dim) and cu_seqlens -> list of (n_b, heads, dim) views."""
    return [packed[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]


def pad(sequences, length=None):
    """List of (n_b, heads, dim) -> padded dense (batch, heads, length, dim) and a key mask.

    The mask (batch, length) is True on real tokens: the padded layout that
    varlen replaces, for comparison in the lecture.
    """
    length = max((len(s) for s in sequences), default=0) if length is None else length
    heads, dim = sequences[0].shape[1:]
    dense = np.zeros((len(sequences), heads, length, dim), dtype=sequences[0].dtype)
    valid = np.zeros((len(sequences), length), dtype=bool)
    for b, s in enumerate(sequences):
        dense[b, :, :len(s)] = s.transpose(1, 0, 2)
        valid[b, :len(s)] = True
    return dense, valid
