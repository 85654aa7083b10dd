"""What recomputing S costs the backward, and what it saves (chapter 12).

The forward could store P (N^2 numbers per head) for the backward; FlashAttention
stores lse (N numbers) and recomputes S = scale Q K^T and P = exp(S - lse)
tile by tile.  Per head, for Nq x Nk visible pairs:

    recompute FLOPs      2 Nq Nk D            (one more Q K^T) and Nq Nk exponentials
    backward FLOPs       2 Nq Nk (3 D + 2 Dv) (S again, dV, dP, dQ, dK)
    bytes not moved      2 Nq Nk e            (P written by the forward and read by the backward)
                         + 4 Nq Nk e          (dP, dS: a naive backward also sends those through HBM)

``recompute_tradeoff`` puts the two in seconds on a machine of the course's
presets (``core.hardware``): the recompute at the matrix units' peak against
moving those bytes at the memory's bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import rules
from ..core.hardware import hardware


def recompute_flops(seqlen_q, seqlen_k, head_dim) -> int:
    """FLOPs of recomputing S = Q K^T for one head (every pair visible)."""
    return 2 * seqlen_q * seqlen_k * head_dim


def backward_flops(seqlen_q, seqlen_k, head_dim, head_dim_v=None) -> int:
    """FLOPs of the tiled backward for one head: S again, dV, dP, dQ, dK."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return 2 * seqlen_q * seqlen_k * (3 * head_dim + 2 * dv)


def stored_p_bytes(seqlen_q, seqlen_k, dtype="float16") -> int:
    """Bytes of P the forward would write and the backward read back, for one head."""
    return 2 * seqlen_q * seqlen_k * rules.itemsize(dtype)


@dataclass(frozen=True)
class Tradeoff:
    recompute_s: float      # one more Q K^T at the matrix units' peak
    p_traffic_s: float      # writing and reading P at the memory's bandwidth
    p_bytes: int
    recompute_flop: int

    @property
    def ratio(self) -> float:
        """How many times longer moving P takes than recomputing it (> 1: recompute wins)."""
        return self.p_traffic_s / self.recompute_s


def recompute_tradeoff(seqlen, head_dim, *, dtype="float16", hw="h200") -> Tradeoff:
    """Recompute S or store P, for one head of N x N on ``hw`` (datasheet peaks)."""
    machine = hardware(hw)
    flop = recompute_flops(seqlen, seqlen, head_dim)
    moved = stored_p_bytes(seqlen, seqlen, dtype)
    return Tradeoff(flop / machine.peak(dtype), moved / machine.memory_bandwidth(), moved, flop)
