"""What recomputing S costs the backward, and what it saves (chapter 12).

The forward could store P (N^2 numbers per head) for the backward; FlashAttention
stores lse (N numbers) and recomputes S = scale Q K^T and P = exp(S - lse)
tile by tile.  Per head, for Nq x Nk visible pairs:

    recompute            2 Nq Nk D FLOPs      (one more Q K^T, on the matrix units)
                         + Nq Nk exponentials (P = exp(S - lse), on the special-function units)
    backward FLOPs       2 Nq Nk (3 D + 2 Dv) (S again, dV, dP, dQ, dK)
    bytes not moved      2 Nq Nk e            (P written by the forward and read by the backward)
                         + 4 Nq Nk e          (dP, dS: a naive backward also sends those through HBM)

``recompute_tradeoff`` puts the two in seconds on a machine of the course's
presets (``core.hardware``): the matmul at the matrix units' peak plus the
exponentials at the special-function units' rate, against moving P at the
memory's bandwidth.  The two recompute terms are added, not overlapped: the
exponentials wait for their tile of S and the next matmul waits for P, and
FA2's backward does not interleave tiles to hide one behind the other.  At
D = 128 on an H100 / H200 the two terms are equal (989 TFLOP/s over 256 FLOPs
per exponential is 3.9 T/s, the exponential rate), so leaving the exponentials
out would halve the recompute's price.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import rules
from ..core.hardware import hardware


def recompute_flops(seqlen_q, seqlen_k, head_dim) -> int:
    """FLOPs of recomputing S = Q K^T for one head (every pair visible)."""
    return 2 * seqlen_q * seqlen_k * head_dim


def recompute_exponentials(seqlen_q, seqlen_k) -> int:
    """Exponentials of recomputing P = exp(S - lse) for one head (every pair visible)."""
    return seqlen_q * seqlen_k


def backward_flops(seqlen_q, seqlen_k, head_dim, head_dim_v=None) -> int:
    """FLOPs of the tiled backward for one head: S again, dV, dP, dQ, dK."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return 2 * seqlen_q * seqlen_k * (3 * head_dim + 2 * dv)


def stored_p_bytes(seqlen_q, seqlen_k, dtype="float16") -> int:
    """Bytes of P the forward would write and the backward read back, for one head."""
    return 2 * seqlen_q * seqlen_k * rules.itemsize(dtype)


@dataclass(frozen=True)
class Tradeoff:
    matmul_s: float         # one more Q K^T at the matrix units' peak
    exp_s: float            # its exponentials at the special-function units' rate
    p_traffic_s: float      # writing and reading P at the memory's bandwidth
    p_bytes: int
    recompute_flop: int
    exponentials: int

    @property
    def recompute_s(self) -> float:
        """The recompute's time: the matmul, then the exponentials of its tile."""
        return self.matmul_s + self.exp_s

    @property
    def ratio(self) -> float:
        """How many times longer moving P takes than recomputing it (> 1: recompute wins)."""
        return self.p_traffic_s / self.recompute_s


def recompute_tradeoff(seqlen, head_dim, *, dtype="float16", hw="h200") -> Tradeoff:
    """Recompute S and P or store P, for one head of N x N on ``hw`` (datasheet peaks, FA3's exponential rate)."""
    machine = hardware(hw)
    if machine.exp_per_s is None:
        raise ValueError(f"{machine.name} has no exponential rate (exp_per_s) in core.hardware; "
                         f"pick a preset that has one, e.g. hw='h200'")
    flop = recompute_flops(seqlen, seqlen, head_dim)
    exps = recompute_exponentials(seqlen, seqlen)
    moved = stored_p_bytes(seqlen, seqlen, dtype)
    return Tradeoff(flop / machine.peak(dtype), exps / float(machine.exp_per_s), moved / machine.memory_bandwidth(),
                    moved, flop, exps)
