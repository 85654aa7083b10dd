"""The tensor-core kernels' layout, decided on the host: what the kernel's fragments and tiles look like.

Plain Python (no numba): the tilings (``MmaTiling``, the tuned tables, the shared memory they take), the
compile-time counts a kernel is built with (``KernelShape``), where P's accumulators go in P V's A fragment
(``HALF_A``, ``TF32_A``, ``tf32_key``), where each word of a swizzled shared tile sits and which rows each
lane hands ``ldmatrix`` (``swizzle``, ``k_rows``, ``v_rows``), and the inputs as the kernel reads them
(``words``, ``kind_of``).  The kernels (``fragments``, ``versions``) compile these functions;
``tests/test_tensor_core.py`` checks them on the CPU against the PTX ISA's fragment tables (``mma``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...core import rules
from ..cuda_steps.tiling import STATIC_SHARED

KINDS = ("f16", "bf16", "tf32x1", "tf32x3")
INPUT_DTYPE = {"f16": np.dtype(np.float16), "bf16": np.dtype(rules.ml_dtypes.bfloat16),
               "tf32x1": np.dtype(np.float32), "tf32x3": np.dtype(np.float32)}
TENSOR_CORE_STEPS = ("mma_f16", "mma_tf32", "mma_3xtf32")


# How P leaves S's accumulators for P V's A fragment (tests/test_tensor_core.py checks both against
# mma's fragment tables):
# - halves (m16n8k16): A register r = (which of the chunk's two 8-key tiles of S, the C float packed into
#   its lower half, the one into its upper half);
HALF_A = ((0, 0, 1), (0, 2, 3), (1, 0, 1), (1, 2, 3))
# - tf32 (m16n8k8): A register r is C float TF32_A[r] of the chunk's one 8-key tile, when A's word w is
#   taken to be key tf32_key(w) of the chunk (B's word w too: the sum over keys is the same in any order).
TF32_A = (0, 2, 1, 3)


def tf32_key(w):
    """The key (0-7) of an 8-key chunk that A's and B's word ``w`` stand for in 3xTF32's P V."""
    return 2 * w if w < 4 else 2 * (w - 4) + 1


@dataclass(frozen=True)
class MmaTiling:
    """The compile-time shape of a tensor-core kernel: ``warps`` warps of 16 query rows, ``Bc`` keys."""

    warps: int = 4
    Bc: int = 64
    staged: bool = True      # a thread's K / V words all loaded before any is stored (False: one at a time)
    prefetch: bool = True    # and the next tile's loaded during this one (registers: Bc * (D + Dv) / threads words);
                             # step b's padded tiles only: the ldmatrix and cp.async versions do not prefetch
    ldmatrix: bool = False   # B fragments by ldmatrix from swizzled, unpadded tiles (V by keys, not transposed)
    stages: int = 1          # 2: cp.async copies the next tile into a second buffer during this one
    split_once: bool = False  # 3xTF32, swizzled tiles: each A fragment split once where it is loaded (step e)
    q_shared: bool = False   # with cp.async: Q's fragments in shared memory, read back a chunk at a time (step f)

    @property
    def Br(self):
        return 16 * self.warps

    @property
    def threads(self):
        return 32 * self.warps


@dataclass(frozen=True)
class KernelShape:
    """What a forward kernel is compiled with: the counts of words, chunks and fragment tiles that its
    loops run over, fixed by (kind, tiling, D, Dv).  Numba takes them as compile-time constants: each
    kernel factory reads the ones it uses into locals, which its device functions close over."""

    kind: str
    tiling: MmaTiling
    tf32: bool               # tf32 operands (a word a float) rather than halves (two a word)
    key_words: int           # words a row of q and k
    out_dims: int            # output dims computed (Dv padded)
    v_words: int             # words a row of v
    k_chunks: int            # 8-word k chunks of S = Q K^T
    s_tiles: int             # 8-key column tiles of S
    o_tiles: int             # 8-dim column tiles of O
    pv_chunks: int           # k chunks of O += P V (8 keys for tf32, 16 for halves)
    k_words_each: int        # K words a thread fetches a tile (register-staged loads)
    v_words_each: int        # V words (pairs of words, halves in padded tiles) a thread fetches a tile
    k_row_chunks: int        # 16-byte chunks a row of K
    v_row_chunks: int        # and of V
    k_chunks_each: int       # K chunks a thread copies a tile (cp.async)
    v_chunks_each: int       # V chunks

    @property
    def k_tile_words(self):
        """Words of one swizzled K tile (ldmatrix's tiles, one a stage)."""
        return self.tiling.Bc * self.key_words

    @property
    def v_tile_words(self):
        return self.tiling.Bc * self.v_words

    @property
    def v_by_keys(self):
        """V stored by keys (rows of ``v_words``), as it comes: tf32's, and every swizzled tile's."""
        return self.tf32 or self.tiling.ldmatrix

    @property
    def padded_v_tile(self):
        """(rows, columns) of the padded V tile: by keys for tf32, transposed (a word two keys) for halves."""
        Bc = self.tiling.Bc
        return (Bc, self.out_dims + 4) if self.tf32 else (self.out_dims, Bc // 2 + 4)

    @property
    def k_folded(self):
        """Rows of whole 128-byte lines (8 chunks): the folded swizzled addresses (``k_address``)."""
        return self.k_row_chunks % 8 == 0

    @property
    def v_folded(self):
        return self.v_row_chunks % 8 == 0


def kernel_shape(kind, tiling, D, Dv):
    """The ``KernelShape`` of a ``kind`` kernel with ``tiling`` at head dims D, Dv."""
    tf32 = kind.startswith("tf32")
    per_word = 1 if tf32 else 2
    Bc, threads = tiling.Bc, tiling.threads
    key_words, out_dims = padded(D, kind) // per_word, padded(Dv, kind)
    v_words = out_dims // per_word
    by_keys = tf32 or tiling.ldmatrix          # V stored by keys (rows of v_words words), not transposed
    return KernelShape(kind, tiling, tf32, key_words, out_dims, v_words, k_chunks=key_words // 8,
                       s_tiles=Bc // 8, o_tiles=out_dims // 8, pv_chunks=Bc // 8 if tf32 else Bc // 16,
                       k_words_each=-(-Bc * key_words // threads),
                       v_words_each=-(-Bc * v_words // threads) if by_keys else -(-(Bc // 2) * v_words // threads),
                       k_row_chunks=key_words // 4, v_row_chunks=v_words // 4,
                       k_chunks_each=-(-Bc * (key_words // 4) // threads),
                       v_chunks_each=-(-Bc * (v_words // 4) // threads))


def padded(n, kind):
    """A head dim rounded up to what the fragments take: 16 halves or 8 tf32s per k chunk (zeros added
    to q and k leave Q K^T unchanged; added to v, they make output dims nobody writes back)."""
    step = 8 if kind.startswith("tf32") else 16
    return -(-n // step) * step


# The register-staged tilings measured fastest on the H200 at B*H = 64, N = 4096 (notebooks/records/gpu_mma.jsonl,
# benchmark gpu_mma_tuned, run 20261202T063651+0000): the start of steps (c) and (d).
TUNED_STAGED = {("f16", 64): MmaTiling(4, 64, staged=True, prefetch=False),
                ("f16", 128): MmaTiling(8, 64, staged=True, prefetch=False),
                ("tf32x3", 64): MmaTiling(8, 32, staged=True, prefetch=False),
                ("tf32x3", 128): MmaTiling(8, 16, staged=True, prefetch=False)}

# After (c) ldmatrix and (d) cp.async: the chain's first run (RUN_CHAIN, the run chapter 11's chain table
# prints, each step checked there at every awkward case), then the fastest of the cp.async sweep at each
# (kind, D) (benchmark gpu_mma_chain_tuned of run RUN_TUNED[kind, D]: warps and tile width swept in one run
# beside the peer), checked again as defaults in a later run (gpu_mma_check).
RUN_CHAIN = "20261202T145416+0000"
RUN_TUNED = {("f16", 64): "20261204T185057+0000", ("f16", 128): "20261204T191650+0000",
             ("tf32x3", 64): "20261204T191650+0000", ("tf32x3", 128): "20261204T191650+0000"}
TUNED = {("f16", 64): MmaTiling(4, 32, staged=True, prefetch=False, ldmatrix=True, stages=2),
         ("f16", 128): MmaTiling(8, 64, staged=True, prefetch=False, ldmatrix=True, stages=2),
         ("tf32x3", 64): MmaTiling(4, 64, staged=True, prefetch=False, ldmatrix=True, stages=2),
         ("tf32x3", 128): MmaTiling(8, 32, staged=True, prefetch=False, ldmatrix=True, stages=2)}


def staged_tiling(kind, D, Dv):
    """The register-staged tiling (steps a and b): ``TUNED_STAGED``'s where one was measured (D = Dv = 64 or
    128); otherwise 4 warps of 16 rows, 64 keys a tile, 32 for tf32 at the larger head dims (its float32 K
    and V tiles must fit the 48 KB of static shared memory), the next tile prefetched where its words fit
    the registers (head dims up to 64)."""
    if D == Dv and (kind, D) in TUNED_STAGED:
        return TUNED_STAGED[kind, D]
    words = padded(max(D, Dv), kind) // (1 if kind.startswith("tf32") else 2)
    tiling = MmaTiling(4, 32 if words > 64 else 64, prefetch=max(D, Dv) <= 64)
    while shared_bytes(kind, tiling, D, Dv) > STATIC_SHARED and tiling.Bc > 16:    # large head dims
        tiling = replace(tiling, Bc=tiling.Bc // 2)
    return tiling


def default_tiling(kind, D, Dv):
    """The tiling a launch gets: ``TUNED``'s where one was measured, otherwise the staged tiling's shape with
    steps (c) and (d): ldmatrix from swizzled tiles filled by cp.async, two stages."""
    if D == Dv and (kind, D) in TUNED:
        return TUNED[kind, D]
    return replace(staged_tiling(kind, D, Dv), staged=True, prefetch=False, ldmatrix=True, stages=2)


# Decode (no more query rows than one warp's 16, against a long cache) is a matter of bytes in flight, not of
# FLOPs: a block of one warp, so that a multiprocessor holds several, each with a K / V tile of about 16 KB in
# flight (cp.async, two stages), and split-KV (``decode_splits``) to give every multiprocessor blocks to hold.
DECODE_ROWS = 16
DECODE_STAGE_BYTES = 16 * 1024


def decode_tiling(kind, D, Dv):
    """The tiling of a launch with at most ``DECODE_ROWS`` query rows: one warp, the widest key tile (16 to 64
    keys) whose two stages of K and V take at most 2 x ``DECODE_STAGE_BYTES``."""
    tiling = MmaTiling(1, 64, staged=True, prefetch=False, ldmatrix=True, stages=2)
    while shared_bytes(kind, tiling, D, Dv) > 2 * DECODE_STAGE_BYTES and tiling.Bc > 16:
        tiling = replace(tiling, Bc=tiling.Bc // 2)
    return tiling


def shared_bytes(kind, tiling, D, Dv):
    """Shared memory of one block: the K tile and the V tile, 4-byte words: rows padded by 4, or, with
    ``ldmatrix``, swizzled (no padding), ``stages`` of each."""
    Bc, Dp, Ep = tiling.Bc, padded(D, kind), padded(Dv, kind)
    w = 1 if kind.startswith("tf32") else 2
    if tiling.ldmatrix:
        q_words = (2 if tiling.split_once else 1) * tiling.Br * Dp // w if tiling.q_shared else 0   # 3xTF32: hi, lo
        return 4 * tiling.stages * Bc * (Dp + Ep) // w + 4 * q_words
    if kind.startswith("tf32"):
        return 4 * (Bc * (Dp + 4) + Bc * (Ep + 4))
    return 4 * (Bc * (Dp // 2 + 4) + Ep * (Bc // 2 + 4))


def swizzle(row, word, rw):
    """Where word ``word`` of row ``row`` of a tile with ``rw`` words a row sits (a flat word index).

    ldmatrix reads 8 rows of 16 bytes (4 words, a "chunk") at once, the same chunk of each row; stored
    plainly, rows of 32 or 64 words would put all 8 in the same 4 of shared memory's 32 banks (an
    8-way conflict).  So the chunk index is XORed with the row: rows r and r + 1 .. r + 7 land on 8
    different chunks of a 128-byte line (all 32 banks), and the tile needs no padding.  Rows of fewer
    than 8 chunks (small head dims) are XORed by the 128-byte line of the flat address instead, which
    spreads any 8 consecutive rows over 8 chunks as well.  A permutation of the tile either way
    (tests/test_tensor_core.py checks both that and the banks)."""
    chunks = rw >> 2
    chunk = word >> 2
    if chunks % 8 == 0:
        return row * rw + ((chunk ^ (row & 7)) << 2) + (word & 3)
    a = row * chunks + chunk
    return ((a ^ ((a >> 3) & 7)) << 2) + (word & 3)


def k_rows(lane, j, kc):
    """The (key, word) of the K tile whose address ``lane`` gives ldmatrix.x4 for S's key tiles j and j + 1
    at k chunk kc: matrix lane // 8 is key tile j + lane // 16, words 4 ((lane // 8) % 2) .. + 3 of the
    chunk (mma.ldmatrix_row), so the four registers are B's two words for tile j, then for tile j + 1."""
    return (j + (lane >> 4)) * 8 + (lane & 7), kc * 8 + 4 * ((lane >> 3) & 1)


def v_rows(lane, e, pc):
    """The (key, word) of the V tile (keys by rows) whose address ``lane`` gives ldmatrix.x4.trans for O's
    dim tiles e and e + 1 at P's 16-key chunk pc: matrix lane // 8 is keys 8 ((lane // 8) % 2) .. + 7 of
    the chunk, the 8 dims (4 words) of tile e + lane // 16; transposed, B's two words for tile e, then e + 1."""
    return pc * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), 4 * (e + (lane >> 4))


def k_address(lane, j, kc, rw):
    """``swizzle(*k_rows(lane, j, kc), rw)`` for rows of a multiple of 8 chunks, written so that the compiler
    sees its parts: row & 7 is lane & 7 (key tiles start at multiples of 8), and chunk 2 kc + h (h = lane's
    word half, 0 or 1) is 2 kc XOR h, so the swizzled chunk is 2 kc XOR (h XOR lane & 7): a lane's constant
    XORed with the call's constant, plus a constant offset j 8 rw.  One instruction an ldmatrix, where the
    swizzle computed from (row, word) takes six (tests/test_tensor_core.py checks that both agree)."""
    y = ((lane >> 3) & 1) ^ (lane & 7)
    return (j * 8 + (lane >> 4) * 8 + (lane & 7)) * rw + (((2 * kc) ^ y) << 2)


def v_address(lane, e, pc, rw):
    """``swizzle(*v_rows(lane, e, pc), rw)`` for rows of a multiple of 8 chunks, the same way: the chunk is
    e + lane // 16 with e even, e XOR (lane // 16), so swizzled e XOR (lane // 16 XOR lane & 7)."""
    y = (lane >> 4) ^ (lane & 7)
    return (pc * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * rw + ((e ^ y) << 2)


def v_word_address(lane, reg, e, pc, rw):
    """Where 3xTF32's P V reads B word ``reg`` of ``lane`` for O's dim tile e at P's 8-key chunk pc: the
    swizzled V tile's word (key pc 8 + tf32_key(w), dim e 8 + n) for (n, w) = ``mma.b_word(lane, reg)``, rows
    of a multiple of 8 chunks.  Folded as ``k_address``: the row's low bits are the key (< 8), the chunk
    2 e + n // 4 is 2 e XOR n // 4, so the swizzled chunk is 2 e XOR (n // 4 XOR key).  b_word's (n, w) is
    (lane // 4, lane % 4 + 4 reg), whose key is 2 (lane % 4) + reg: spelled out, so that the device function
    calls nothing (numba's type inference did not finish on the kernel with the two calls inlined)."""
    n, key = lane >> 2, 2 * (lane & 3) + reg
    return (pc * 8 + key) * rw + (((2 * e) ^ ((n >> 2) ^ key)) << 2) + (n & 3)


def words(x, kind):
    """An input as the kernel reads it: its last dim zero-padded to the fragments' multiple, C-contiguous,
    its bits as 32-bit words (two halves, or one float32, a word).  No copy when nothing is padded."""
    n = x.shape[-1]
    x = np.ascontiguousarray(x)
    if padded(n, kind) != n:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], padded(n, kind) - n), x.dtype)], axis=-1)
    return x.view(np.uint32)


def kind_of(step, dtype):
    """The kernel a step runs for inputs of ``dtype``."""
    dtype = np.dtype(dtype)
    if step not in TENSOR_CORE_STEPS:
        raise ValueError(f"step must be one of {TENSOR_CORE_STEPS}, got {step!r}")
    if step != "mma_f16":
        if dtype != np.float32:
            raise TypeError(f"{step} computes float32 inputs on the tf32 tensor cores; q, k and v are {dtype}")
        return "tf32x3" if step == "mma_3xtf32" else "tf32x1"
    for kind in ("f16", "bf16"):
        if dtype == INPUT_DTYPE[kind]:
            return kind
    raise TypeError(f"mma_f16 takes float16 or bfloat16 inputs (the tensor cores' half types); q, k and v are "
                    f"{dtype}: cast them, or use mma_3xtf32 for float32")
