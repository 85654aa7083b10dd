"""The host side that every compiled kernel shares (chapters 08 and 09).

A compiled kernel gets plain arrays and plain numbers: no ``MaskSpec``, no
options object.  ``prepare`` turns a validated call into those, once, on the
host, the same way for the CPU kernel (``flash_numba_cpu``) and the GPU one:

- the tile sizes Br x Bc (the call's ``block_q`` / ``block_k``, else the
  impl's default in ``DEFAULT_TILES``, applied by ``tile_sizes`` for every
  tiled impl, the numpy ones too) and the tile plan, a (Tr, Tc) int8 array of
  ``rules.EMPTY / PARTIAL / FULL``: which tiles to skip and which need the
  elementwise mask is decided here, not in the kernel;
- the mask as numbers (diagonal offset, window sides with causal folded in),
  the K / V head each query head reads (GQA / MQA), the softmax scale, the
  softcap, ALiBi slopes (B, H) (zeros when off);
- the precision: the inputs converted once to the accumulation dtype (exact
  for float16 / bfloat16, whose values float32 holds), and where P is rounded
  before P V (``rules.p_round_dtype``), as significant bits for
  ``rules.round_to_bits``.  Float8 inputs are dequantised here, once, with
  their descales (``reference.dequantize``); P is then rounded to e4m3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import rules
from ..core.reference import dequantize, kv_head_index

# The tile (block_q, block_k) = (Br, Bc) each tiled impl runs when a call gives none.
DEFAULT_TILES = {
    "flash_numpy": (64, 64),                 # and the counted kernel, which runs its loops
    "flash_numba_cpu": (64, 64),
    # Br threads per block, one per query row; Bc keys per shared-memory tile, halved
    # while Kj and Vj overflow it.  From a sweep on the H200 (records/gpu_attention.jsonl,
    # "gpu_attention_blocks").
    "flash_numba_cuda": (128, 64),
    "flash_numba_cuda in a simulator": (32, 64),  # every idle thread costs a Python thread there
}
# The course's tile where no impl is named (the IO model's default, the checks' reports).
DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K = DEFAULT_TILES["flash_numpy"]


@dataclass(frozen=True)
class Launch:
    """Everything a compiled kernel is launched with, besides q, k and v."""

    Br: int                  # query rows per tile (block_q)
    Bc: int                  # keys per tile (block_k)
    tiles: np.ndarray        # (Tr, Tc) int8: rules.EMPTY / PARTIAL / FULL
    kv_head: np.ndarray      # (H,) int64: the K / V head of each query head
    offset: int              # query i stands at key position i + offset
    left: int                # window sides, -1 unbounded, causal folded in
    right: int
    softmax_scale: float
    softcap: float           # 0: off
    alibi: bool
    slopes: np.ndarray       # (B, H) float64, zeros without ALiBi
    acc_dtype: np.dtype      # float32, or float64 for float64 inputs
    round_bits: int          # P rounded to this many significant bits before P V; 0: not rounded
    round_min_exponent: int  # ... with no quantum below 2**round_min_exponent (subnormals)

    @property
    def computed_tiles(self) -> int:
        return int(np.count_nonzero(self.tiles != rules.EMPTY))


def tile_sizes(opts, default_block_q: int, default_block_k: int) -> tuple:
    """(Br, Bc) of one call: its ``block_q`` / ``block_k``, and where one is None the default given."""
    return opts.block_q or default_block_q, opts.block_k or default_block_k


def prepare(q, k, v, opts, mask, default_block_q: int, default_block_k: int):
    """(Launch, q, k, v) for validated dense inputs: the arrays C-contiguous in the accumulation dtype.

    The tiles are ``tile_sizes(opts, default_block_q, default_block_k)``."""
    Br, Bc = tile_sizes(opts, default_block_q, default_block_k)
    acc_dtype = rules.acc_dtype(q.dtype)
    round_dtype = rules.p_round_dtype(q.dtype)
    bits, min_exponent = rules.ROUNDING[round_dtype.name] if round_dtype is not None else (0, 0)
    left, right = mask.window
    batch, heads = q.shape[:2]
    slopes = opts.alibi_slopes if opts.alibi_slopes is not None else np.zeros((batch, heads))
    launch = Launch(
        Br=Br, Bc=Bc, tiles=mask.tile_codes(Br, Bc), kv_head=kv_head_index(heads, k.shape[1]),
        offset=mask.offset, left=left, right=right, softmax_scale=opts.softmax_scale,
        softcap=opts.softcap, alibi=opts.alibi_slopes is not None,
        slopes=np.ascontiguousarray(slopes, dtype=np.float64), acc_dtype=acc_dtype,
        round_bits=bits, round_min_exponent=min_exponent)
    descales = opts.descale or (None, None, None)
    # No copy where an input already is contiguous in the accumulation dtype (the
    # kernels never write to q, k, v): three copies cost a call 10-25 ms at N = 1024-4096.
    arrays = (np.ascontiguousarray(x, dtype=acc_dtype) if d is None
              else np.ascontiguousarray(dequantize(x, d, acc_dtype))
              for x, d in zip((q, k, v), descales))
    return (launch, *arrays)
