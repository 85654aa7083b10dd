"""Where the conversion sits: float8 / float16 to float32 inside the hot loop, or once before it.

A CPU has no float8 arithmetic (and numba none for float16), so a kernel
fed low-precision K must convert every element to float32 somewhere.  The
three places, as three compiled versions of the score loop S = Q K^T (the hot
loop of attention, Nq x Nk x D multiply-adds):

- ``scores_f32``: K converted once before the kernel (``decode_all``), the loop reads float32;
- ``scores_tile``: each K tile decoded into a float32 buffer as it is loaded,
  once per query tile (what a tiled kernel does: every element converted Tr times);
- ``scores_in_loop``: every use of an element decodes it (Nq conversions each),
  the conversion inside the innermost loop.

float8 decodes through a 256-entry table (``decode_table``); float16 also
through its 65536-entry table (256 KiB: it does not stay in L1).  Converting
once moves 4 bytes per element through the loop instead of 1 or 2; converting
in the loop moves the small bytes but pays the conversion on every use.
"""
from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers the float8 / bfloat16 dtypes by name)
import numpy as np

try:
    import numba
except ModuleNotFoundError:
    numba = None

BITS = {"float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8, "float16": np.uint16, "bfloat16": np.uint16}


def decode_table(dtype) -> np.ndarray:
    """float32 value of every bit pattern of a 1- or 2-byte format (NaN patterns included)."""
    bits = BITS[np.dtype(dtype).name]
    patterns = np.arange(np.iinfo(bits).max + 1, dtype=np.int64).astype(bits)
    return patterns.view(np.dtype(dtype)).astype(np.float32)


def as_bits(x) -> np.ndarray:
    """A low-precision array's raw bits (uint8 / uint16), what a compiled kernel can take."""
    return np.ascontiguousarray(x).view(BITS[x.dtype.name])


if numba is not None:
    @numba.njit(cache=True)
    def decode_all(bits, table, out):
        """out = table[bits]: every element converted once."""
        flat_in, flat_out = bits.reshape(-1), out.reshape(-1)
        for i in range(flat_in.size):
            flat_out[i] = table[flat_in[i]]

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def scores_f32(q, k, s):
        """s = q k^T with k already float32."""
        for i in range(q.shape[0]):
            for j in range(k.shape[0]):
                acc = np.float32(0)
                for d in range(q.shape[1]):
                    acc += q[i, d] * k[j, d]
                s[i, j] = acc

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def scores_in_loop(q, k_bits, table, s):
        """s = q k^T, every element of k decoded where it is used."""
        for i in range(q.shape[0]):
            for j in range(k_bits.shape[0]):
                acc = np.float32(0)
                for d in range(q.shape[1]):
                    acc += q[i, d] * table[k_bits[j, d]]
                s[i, j] = acc

    @numba.njit(cache=True, fastmath={"reassoc", "contract"})
    def scores_tile(q, k_bits, table, s, block_q, block_k):
        """s = q k^T, each K tile decoded into a float32 buffer once per query tile."""
        Nq, D = q.shape
        Nk = k_bits.shape[0]
        Kj = np.empty((block_k, D), np.float32)
        for r0 in range(0, Nq, block_q):
            r1 = min(r0 + block_q, Nq)
            for c0 in range(0, Nk, block_k):
                n = min(c0 + block_k, Nk) - c0
                for c in range(n):
                    for d in range(D):
                        Kj[c, d] = table[k_bits[c0 + c, d]]
                for i in range(r0, r1):
                    for c in range(n):
                        acc = np.float32(0)
                        for d in range(D):
                            acc += q[i, d] * Kj[c, d]
                        s[i, c0 + c] = acc


def conversions(nq, nk, d, place, block_q=64) -> int:
    """How many element conversions each place makes for an (nq x d) by (nk x d) score loop."""
    counts = {"once": nk * d, "tile": -(-nq // block_q) * nk * d, "in_loop": nq * nk * d}
    if place not in counts:
        raise ValueError(f"place must be one of {sorted(counts)}, got {place!r}")
    return counts[place]


def break_even_ns(bytes_saved_per_element, bandwidth) -> float:
    """A conversion pays for itself when it costs less than moving the bytes it saves: that time, in ns."""
    return bytes_saved_per_element / bandwidth * 1e9
