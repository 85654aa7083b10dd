"""KV caches: what decoding keeps so that each new token costs one query, not a whole rerun.

``KVCache`` is the plain one: per layer a (B, H_kv, max_len, D) buffer for K
and one for V, filled left to right; a decode step appends one key and one
value per head and attends over the first ``length`` slots.

``PagedKVCache`` is vLLM's: the memory is a pool of fixed-size blocks of
``block_size`` token slots, each sequence owns a list of block ids (its row of
the block table), and a block is taken from the free list only when a
sequence's last one is full.  A sequence wastes at most ``block_size - 1``
slots instead of ``max_len - length``, and sequences of any lengths share one
pool.  ``paged_decode_attention`` reads K / V through the block table, one
block at a time, with chapter 04's online softmax: a page is a key tile.

Bytes a decode step reads (the reason decode is memory bound): every cached
key and value of every layer once, ``cache_bytes_per_token`` per token held.
"""
from __future__ import annotations

import numpy as np

from ..core import online_softmax


def cache_bytes_per_token(n_layers, n_kv_heads, head_dim, dtype) -> int:
    """Bytes of K and V one cached token holds over all layers: 2 * L * H_kv * D * itemsize."""
    return 2 * n_layers * n_kv_heads * head_dim * np.dtype(dtype).itemsize


def check_cache(cache, *, n_layers, batch, n_kv_heads, head_dim, dtype):
    """Refuse a cache built for another model, batch or dtype, saying what differs."""
    if not isinstance(cache, (KVCache, PagedKVCache)):
        raise TypeError(f"cache must be a KVCache or a PagedKVCache, got {type(cache).__name__}")
    want = {"n_layers": n_layers, "batch": batch, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
            "dtype": np.dtype(dtype)}
    have = {"n_layers": cache.n_layers, "batch": cache.batch, "n_kv_heads": cache.n_kv_heads,
            "head_dim": cache.head_dim, "dtype": cache.dtype}
    wrong = [f"{name} {have[name]} (the model needs {want[name]})" for name in want if have[name] != want[name]]
    if wrong:
        raise ValueError("KV cache of the wrong shape: " + ", ".join(wrong))


class KVCache:
    """Contiguous K / V buffers (n_layers, B, H_kv, max_len, D), all sequences the same length."""

    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim, *, dtype=np.float32):
        self.n_layers, self.batch, self.n_kv_heads = n_layers, batch, n_kv_heads
        self.max_len, self.head_dim, self.dtype = max_len, head_dim, np.dtype(dtype)
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = np.zeros(shape, dtype=self.dtype)
        self.v = np.zeros(shape, dtype=self.dtype)
        self.length = 0

    def positions(self, T) -> np.ndarray:
        """Positions (B, T) of T tokens that follow the cached ones."""
        if self.length + T > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} tokens; {self.length} + {T} do not fit")
        return np.broadcast_to(np.arange(self.length, self.length + T), (self.batch, T))

    def append(self, layer, k, v):
        """Write k, v (B, H_kv, T, D) after the cached tokens of ``layer`` (``advance`` moves the end)."""
        T = k.shape[2]
        self.k[layer, :, :, self.length:self.length + T] = k
        self.v[layer, :, :, self.length:self.length + T] = v

    def view(self, layer, extra=0):
        """K and V (B, H_kv, length + extra, D) of ``layer``: views, no copy."""
        end = self.length + extra
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def append_and_attend(self, layer, q, k, v, attend):
        self.append(layer, k, v)
        return attend(q, *self.view(layer, extra=k.shape[2]))

    def advance(self, T):
        self.length += T

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class PagedKVCache:
    """A pool of K / V blocks (n_layers, num_blocks, H_kv, block_size, D) and a block table per sequence."""

    def __init__(self, n_layers, n_kv_heads, head_dim, *, batch=1, block_size=16, num_blocks=None,
                 max_len=256, dtype=np.float32):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.batch, self.block_size, self.max_len, self.dtype = batch, block_size, max_len, np.dtype(dtype)
        if num_blocks is None:
            num_blocks = batch * -(-max_len // block_size)
        self.num_blocks = num_blocks
        shape = (n_layers, num_blocks, n_kv_heads, block_size, head_dim)
        self.k_pool = np.zeros(shape, dtype=self.dtype)
        self.v_pool = np.zeros(shape, dtype=self.dtype)
        self.free = list(range(num_blocks))[::-1]   # a stack: pop() gives block 0 first
        self.block_table = [[] for _ in range(batch)]  # block ids of each sequence, in order
        self.lengths = np.zeros(batch, dtype=np.int64)

    def positions(self, T) -> np.ndarray:
        if int(self.lengths.max()) + T > self.max_len:
            raise ValueError(f"a sequence would pass {self.max_len} tokens (longest holds {self.lengths.max()})")
        return self.lengths[:, None] + np.arange(T)[None, :]

    def slot(self, seq, position):
        """(block id, offset) of a token position of sequence ``seq``: the block-table lookup."""
        return self.block_table[seq][position // self.block_size], position % self.block_size

    def reserve(self, seq, length):
        """Take blocks from the free list until sequence ``seq`` has room for ``length`` tokens."""
        while len(self.block_table[seq]) * self.block_size < length:
            if not self.free:
                raise MemoryError(f"the KV pool's {self.num_blocks} blocks of {self.block_size} tokens are all "
                                  "in use; free a sequence or build a larger pool")
            self.block_table[seq].append(self.free.pop())

    def append(self, layer, k, v):
        """Scatter k, v (B, H_kv, T, D) into each sequence's blocks after its cached tokens."""
        T = k.shape[2]
        for b in range(self.batch):
            self.reserve(b, int(self.lengths[b]) + T)
            for t in range(T):
                block, offset = self.slot(b, int(self.lengths[b]) + t)
                self.k_pool[layer, block, :, offset] = k[b, :, t]
                self.v_pool[layer, block, :, offset] = v[b, :, t]

    def gather(self, layer, seq, length):
        """K and V (H_kv, length, D) of one sequence, copied out of its blocks in order."""
        blocks = self.block_table[seq][:-(-length // self.block_size)]
        k = self.k_pool[layer, blocks].transpose(1, 0, 2, 3).reshape(self.n_kv_heads, -1, self.head_dim)
        v = self.v_pool[layer, blocks].transpose(1, 0, 2, 3).reshape(self.n_kv_heads, -1, self.head_dim)
        return k[:, :length], v[:, :length]

    def append_and_attend(self, layer, q, k, v, attend):
        """Decode (T = 1) reads through the block table; a prompt attends to its own fresh K / V."""
        T = k.shape[2]
        fresh = bool((self.lengths == 0).all())
        self.append(layer, k, v)
        if T == 1:
            return paged_decode_attention(q, self, layer, self.lengths + 1)
        if fresh:
            return attend(q, k, v)
        outs = []  # a prompt after cached tokens: copy each sequence out of its pages
        for b in range(self.batch):
            kb, vb = self.gather(layer, b, int(self.lengths[b]) + T)
            outs.append(attend(q[b:b + 1], kb[None], vb[None]))
        return np.concatenate(outs)

    def advance(self, T):
        self.lengths += T

    def release(self, seq):
        """Give sequence ``seq``'s blocks back to the pool."""
        self.free.extend(reversed(self.block_table[seq]))
        self.block_table[seq] = []
        self.lengths[seq] = 0

    def blocks_in_use(self) -> int:
        return sum(len(row) for row in self.block_table)

    def nbytes(self) -> int:
        return self.k_pool.nbytes + self.v_pool.nbytes


def paged_decode_attention(q, cache: PagedKVCache, layer, lengths, *, softmax_scale=None):
    """One query per sequence against its cached keys, read page by page through the block table.

    q: (B, H, 1, D); sequence b has ``lengths[b]`` tokens in its blocks.  Each
    block is a key tile: its scores fold into the running (m, l, O) with
    ``online_softmax.online_update``; the slots past the end of the last block
    are masked.  Accumulates in float32 (float64 for float64 input).
    Returns (B, H, 1, D) in q's dtype.
    """
    B, H, one, D = q.shape
    Hk, bs = cache.n_kv_heads, cache.block_size
    if one != 1:
        raise ValueError(f"paged decode takes one query per sequence, got seqlen_q {one}")
    acc = np.float64 if q.dtype == np.float64 else np.float32
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    out = np.empty(q.shape, dtype=q.dtype)
    for b in range(B):
        qg = q[b, :, 0].astype(acc).reshape(Hk, H // Hk, D) * acc(scale)  # query heads grouped by K/V head
        m, l, o = online_softmax.init_state((Hk, H // Hk), D, dtype=acc)
        n = int(lengths[b])
        for i, block in enumerate(cache.block_table[b][:-(-n // bs)]):
            kj = cache.k_pool[layer, block].astype(acc)  # (Hk, bs, D): one page
            vj = cache.v_pool[layer, block].astype(acc)
            s = qg @ kj.transpose(0, 2, 1)               # (Hk, G, bs)
            valid = n - i * bs
            if valid < bs:
                s[..., valid:] = -np.inf
            m, l, o, _ = online_softmax.online_update(m, l, o, s, vj)
        out[b, :, 0] = online_softmax.finalize_out(l, o).reshape(H, D)
    return out
