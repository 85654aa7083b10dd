"""The compile-time shape of a micro-tiled kernel (``Tiling``), and each step's.

A step's Tiling says which kernel it runs (``vec``, ``prefetch``) and with
which numbers (tile sizes, threads, padding, index type); ``run.plan`` picks
the kernel from it, ``layout`` cuts the one dynamic shared buffer (a ``Layout``).
A kernel reads both as compile-time constants (``device`` tells numba so).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...core import hardware

_H200 = hardware.hardware("h200")
STATIC_SHARED = _H200.static_smem_per_block            # what a block gets without asking the driver
MAX_SHARED = int(float(_H200.max_smem_per_block))     # what an H200 block may get after asking


@dataclass(frozen=True)
class Tiling:
    """The compile-time shape of a micro-tiled kernel.

    ``threads`` threads form a TY x TX grid (TX = ``tx`` threads along keys /
    output dims, TY = threads // TX along query rows).  Thread (ty, tx) owns
    query rows ty + TY r (r < RM), keys tx + TX c (c < RN) of S and output
    dims tx + TX e (e < RE) of O: strided, so that the threads of a warp touch
    consecutive rows, keys and dims.

    The kernel: ``vec`` False, ``prefetch`` False: ``tiled``; ``prefetch`` True:
    ``tiled_prefetch``; ``vec`` True: ``tiled_vec4``, and with ``prefetch``
    ``tiled_staged`` (a whole K / V tile through registers, one tile ahead).
    ``tiled_vec4`` is reached one change a step: ``tiled_rebuilt`` (its kernel
    on ``tiled_prefetch``'s tile sizes, ``shuffle`` and ``last_first`` off,
    ``align`` 0), ``tiled_shuffle`` (``shuffle``), ``tiled_reorder``
    (``last_first``), ``tiled_aligned`` (``align`` 16), ``tiled_vec4`` (the
    larger tiles); ``tiled_staged``'s kernel has none of these switches.
    Each of those switch settings is a kernel of its own (``tiled_vec4.py``).
    """

    Br: int = 64             # query rows per block
    Bc: int = 32             # keys per tile
    threads: int = 128
    tx: int = 8
    pad: int = 1             # floats added to every shared row (0: bank conflicts)
    prefetch: bool = True    # the next K / V tile loaded into registers during the current one
    max_regs: int = 0        # a cap on registers per thread for the compiler (0: its own choice)
    unsigned: bool = True    # shared / global indices cast to uint64 (False: numba's wraparound code)
    vec: bool = False        # 16-byte shared loads, shuffles, heaviest tiles first (tiled_vec4, tiled_staged)
    align: int = 16          # bytes the vec kernels' shared buffer is declared aligned to (0: a float's 4)
    shuffle: bool = True     # the vec kernels' row max and sum by warp shuffles (False: through shared memory)
    last_first: bool = True  # the vec kernels' grid: heads fastest, last query tile first (False: tiled's)

    @property
    def ty(self):
        return self.threads // self.tx

    @property
    def rm(self):
        return self.Br // self.ty

    @property
    def rn(self):
        return self.Bc // self.tx

    def check(self, D, Dv):
        if self.threads % self.tx or self.Br % self.ty or self.Bc % self.tx or self.threads > 1024:
            raise ValueError(f"{self}: threads must be a multiple of tx, Br of threads / tx and Bc of tx")
        if self.vec and (32 % self.tx or self.Bc % 4):
            raise ValueError(f"{self}: the vectorised kernel needs tx to divide a warp (32) and Bc a multiple of 4")
        if self.vec and self.prefetch and (self.align != 16 or not self.shuffle or not self.last_first):
            raise ValueError(f"{self}: tiled_staged's kernel has no align, shuffle or last_first switch")
        if self.vec and self.switches not in VEC_SWITCHES:
            raise ValueError(f"{self}: the vectorised kernels turn on shuffle, then last_first, then align 16 "
                             f"(tiled_rebuilt, tiled_shuffle, tiled_reorder, tiled_aligned); no other mix has a kernel")
        if self.shared_bytes(D, Dv) > MAX_SHARED:
            raise ValueError(f"{self} needs {self.shared_bytes(D, Dv)} bytes of shared memory at D={D}, "
                             f"Dv={Dv}; a block gets at most {MAX_SHARED}")

    @property
    def switches(self):
        """(shuffle, last_first, align): which of the vectorised kernels the Tiling runs."""
        return self.shuffle, self.last_first, self.align

    def layout(self, D, Dv):
        """Offsets (in floats) of Qs, Ks (= Ps), Vs, red in the dynamic buffer, and its size."""
        if self.vec:
            return self.vec_layout(D, Dv)
        re = -(-Dv // self.tx)
        dp, ep, bp = D + self.pad, re * self.tx, self.Bc + self.pad
        qs = 0
        ks = qs + self.Br * dp
        vs = ks + max(self.Bc * dp, self.Br * bp)   # P reuses Ks once S is computed
        red = vs + self.Bc * ep
        return Layout(D=D, Dv=Dv, QS=qs, KS=ks, PS=ks, VS=vs, RED=red, DP=dp, EP=ep, BP=bp, RE=re,
                      NK=-(-self.Bc * D // self.threads), NV=-(-self.Bc * ep // self.threads),
                      size=red + self.Br * self.tx)

    def vec_layout(self, D, Dv):
        """tiled_vec4's buffer: every row a multiple of 4 floats (16 bytes, one ``ld.shared.v4``).
        Q and K rows are D4 = D rounded up to 4 (zeros past D), strided DP = D4 rounded up to 32,
        plus 4: the 8 threads that one 16-byte load serves at a time read 8 different rows, which
        then start in 8 different groups of 4 banks.  A thread owns output dims in chunks of 4
        (4 tx + 4 TX g + j), so V rows are EP = 4 TX RG wide.  P has its own rows (BP = Bc + 4)."""
        d4 = -(-D // 4) * 4
        dp = -(-d4 // 32) * 32 + 4
        rg = -(-Dv // (4 * self.tx))
        ep = 4 * self.tx * rg
        bp = self.Bc + 4
        qs = 0
        ks = qs + self.Br * dp
        vs = ks + self.Bc * dp
        ps = vs + self.Bc * ep
        red = ps + self.Br * bp
        return Layout(D=D, Dv=Dv, QS=qs, KS=ks, PS=ps, VS=vs, RED=red, DP=dp, EP=ep, BP=bp, RE=4 * rg, RG=rg, D4=d4,
                      NK=-(-self.Bc * d4 // self.threads), NV=-(-self.Bc * ep // self.threads),
                      size=red + self.Br * self.tx)

    def shared_bytes(self, D, Dv):
        return 4 * self.layout(D, Dv).size

    # What one thread does per key tile in the two matmuls (S = Q K^T, O += P V): counts of the
    # kernel's source, the model chapter 10's exercises hold answers to (not a measurement).
    def fmas(self, D, Dv):
        """FMAs per thread per key tile: RM x RN per dim of Q K^T, RM x RE per key of P V."""
        L = self.layout(D, Dv)
        return self.rm * (self.rn * (L.D4 if self.vec else D) + L.RE * self.Bc)

    def shared_loads(self, D, Dv):
        """Shared-memory load instructions per thread per key tile: RM + RN values per dim, RM + RE
        per key; the vectorised kernels load them four to an instruction (``ld.shared.v4``)."""
        L = self.layout(D, Dv)
        if self.vec:
            return (L.D4 * (self.rm + self.rn) + self.Bc * (self.rm + L.RE)) // 4
        return D * (self.rm + self.rn) + self.Bc * (self.rm + L.RE)

    def live_floats(self, D, Dv):
        """float32 values a thread keeps in its inner loops: the S and O accumulators, the operands
        read from shared memory, m and l (and the row max in the vectorised kernels), and with
        ``prefetch`` the next tile's K / V in flight.  The compiler adds addresses and counters
        (the records' ``regs_per_thread`` are 14-90 above this at chapter 10's tilings)."""
        L = self.layout(D, Dv)
        acc = self.rm * self.rn + self.rm * L.RE + 2 * self.rm
        if self.vec:
            operands = 4 * (self.rm + self.rn + L.RG) + self.rm
        else:
            operands = self.rm + self.rn + L.RE         # a (Q, then P), bk, pv
        staged = 0
        if self.prefetch:
            d = L.D4 if self.vec else D
            staged = -(-self.Bc * d // self.threads) + -(-self.Bc * L.EP // self.threads)
        return acc + operands + staged


@dataclass(frozen=True)
class Layout:
    """Where a micro-tiled kernel's arrays sit in its one dynamic shared buffer, for head dims D, Dv:
    offsets (in floats) of Qs, Ks, Ps (= Ks but in the vectorised kernels), Vs and the reduction
    array red; row strides DP (Q, K), EP (V), BP (P); the output dims a thread owns (RE, in RG
    chunks of 4 in the vectorised kernels, whose Q and K rows are D4 = D rounded up to 4 floats);
    the K and V elements each thread loads per tile (NK, NV); and the buffer's size."""

    D: int
    Dv: int
    QS: int
    KS: int
    PS: int
    VS: int
    RED: int
    DP: int
    EP: int
    BP: int
    RE: int
    NK: int
    NV: int
    size: int
    RG: int = 0
    D4: int = 0


# The vectorised kernels without prefetch, one switch a step: (shuffle, last_first, align) of each.
VEC_SWITCHES = {(False, False, 0): "tiled_rebuilt", (True, False, 0): "tiled_shuffle",
                (True, True, 0): "tiled_reorder", (True, True, 16): "tiled_aligned"}

# Decode (Nq = 1): a block of one warp per query row, its 32 threads along the keys and dims.
DECODE_TILING = Tiling(Br=1, Bc=32, threads=32, tx=32, pad=4, prefetch=True, vec=True)
SIM_TILING = Tiling(Br=8, Bc=8, threads=16, tx=4)   # the simulators run a Python thread per CUDA thread

# What each step changes, as a Tiling (``tuned``'s comes from ``tuning.autotune``).
STEP_TILING = {
    "tiled": Tiling(pad=0, prefetch=False, unsigned=False),
    "tiled_unsigned": Tiling(pad=0, prefetch=False),
    "tiled_padded": Tiling(pad=1, prefetch=False),
    "tiled_prefetch": Tiling(pad=1, prefetch=True),
    "tiled_rebuilt": Tiling(pad=4, prefetch=False, vec=True, align=0, shuffle=False, last_first=False),
    "tiled_shuffle": Tiling(pad=4, prefetch=False, vec=True, align=0, last_first=False),
    "tiled_reorder": Tiling(pad=4, prefetch=False, vec=True, align=0),
    "tiled_aligned": Tiling(pad=4, prefetch=False, vec=True),
    "tiled_vec4": Tiling(Br=128, Bc=64, threads=256, tx=16, pad=4, prefetch=False, vec=True),
    "tiled_staged": Tiling(Br=128, Bc=64, threads=256, tx=16, pad=4, prefetch=True, vec=True),
}
TUNED = {}   # D -> Tiling, filled by ``tuning.autotune`` (or from a gpu_steps_tuned record)
# The autotuner's candidates: (Br, Bc, threads, tx), each with the pad and the prefetch.
CANDIDATES = [
    (64, 32, 128, 8), (64, 64, 128, 8), (64, 32, 256, 16), (64, 64, 256, 16), (128, 32, 256, 8),
    (128, 64, 256, 8), (128, 32, 128, 8), (32, 32, 64, 8), (64, 16, 128, 8), (128, 64, 256, 16),
]
