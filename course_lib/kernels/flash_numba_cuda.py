"""impl ``flash_numba_cuda``: the tiled FlashAttention forward as a Numba CUDA kernel.

Chapter 09's kernel.  The algorithm is chapter 08's, unchanged (FA2 loop order,
online softmax, the tile plan decided on the host); what changes is who runs
it:

- the grid is (Tr, B x H): one block per (query tile, batch x head), so the
  blocks share nothing and need no ordering;
- a block is Br threads, one per query row i of the tile.  Thread i keeps its
  row of Q (``q_i``), its accumulator (``o_i``) and its (m, l) in registers /
  local memory for the whole kernel, as FlashAttention-2 keeps O on chip;
- each K / V tile (Kj, Vj) is loaded once into shared memory by all the
  threads of the block together (consecutive threads read consecutive
  elements: coalesced), then read by every thread.  Two barriers per tile:
  after the load (nobody reads a tile before it is whole) and after the use
  (nobody overwrites it while another thread still reads it);
- an EMPTY tile is skipped by the whole block (every thread of a block reads
  the same plan entry, so they all take the same branch and meet at the same
  barriers); only PARTIAL tiles apply the mask element by element;
- tails: the last query tile has threads with no row (they still load and
  wait at the barriers, but compute nothing and write nothing), and the last
  key tile is loaded and read only up to Nk.

The scalar rules (mask, ALiBi distance, softcap, the online-softmax step,
finalize) are ``course_lib.core.rules``, compiled here with
``cuda.jit(device=True)`` as they are.  The arithmetic is float32 throughout;
float64, float16 and bfloat16 are refused with a TypeError (chapter 11 takes
up low precision on the GPU).

Where it runs.  With a GPU (``numba.cuda.is_available()``) the kernel is
launched on it.  With ``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported,
numba's own simulator runs it.  Otherwise (no GPU, no simulator) the course's
simulator, ``course_lib.cudacheck``, runs the very same kernel and also checks
every access for races, out-of-bounds and uninitialised reads.  Both
simulators run one Python thread per CUDA thread, so they take only small
problems (``SIM_MAX_WORK``) and say so when given a larger one, with how long
the limit takes; the environment variable ``FLASH_SIM_MAX_WORK`` raises it.
The inputs are copied to the device and never written back.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

try:
    import numba
    from numba import cuda, float32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the impl is unavailable, nothing else
    numba = None

from ..core import hardware, rules
from ..core.reference import lse_of_rebased, nan_lse_where_out_is_nan
from . import launch as host

# Br: threads per block, one per query row; Bc: keys per shared-memory tile (their
# defaults, on a GPU and in the simulators: launch.DEFAULT_TILES).
_GPU = hardware.hardware("h200")
MAX_THREADS = _GPU.max_threads_per_block        # per block, on every CUDA GPU
SHARED_BYTES = _GPU.static_smem_per_block       # static shared memory a block may use
# The simulators run one Python thread per CUDA thread: B * H * Nq * Nk * (D + Dv)
# above this takes minutes there, so they refuse it, unless the environment variable
# FLASH_SIM_MAX_WORK raises the limit (e.g. FLASH_SIM_MAX_WORK=20000000 for ten times as much).
SIM_MAX_WORK = 2_000_000
SIM_MAX_WORK_VARIABLE = "FLASH_SIM_MAX_WORK"
# seconds per unit of that work, measured on the course's 2-core machine under a load of 3.5
# (1 x 1 x 128 x 128, D = Dv = 16: 7.5 s in cudacheck, 1.6 s in numba's simulator)
SIM_SECONDS_PER_UNIT = {"cudacheck": 1.4e-5, "numba simulator": 3.1e-6}


def sim_max_work() -> int:
    """The most work (B * H * Nq * Nk * (D + Dv)) a simulator run takes: SIM_MAX_WORK, or
    the environment variable FLASH_SIM_MAX_WORK where a caller set it."""
    value = os.environ.get(SIM_MAX_WORK_VARIABLE, "").strip()
    if not value:
        return SIM_MAX_WORK
    try:
        return int(value.replace("_", ""))
    except ValueError:
        raise ValueError(f"{SIM_MAX_WORK_VARIABLE}={value!r}: give the most work a simulator run may take "
                         f"as an integer, e.g. {SIM_MAX_WORK_VARIABLE}={10 * SIM_MAX_WORK}") from None


def available() -> bool:
    return numba is not None


def on_gpu() -> bool:
    """True when a real GPU runs the kernel (not numba's simulator, not cudacheck)."""
    return numba is not None and not numba.config.ENABLE_CUDASIM and cuda.is_available()


def where() -> str:
    """Which of the three runs the kernel here: 'gpu', 'numba simulator' or 'cudacheck'."""
    if numba.config.ENABLE_CUDASIM:
        return "numba simulator"
    return "gpu" if cuda.is_available() else "cudacheck"


if numba is not None:
    _rule = cuda.jit(device=True)
    visible = _rule(rules.visible)
    alibi_rebased_distance = _rule(rules.alibi_rebased_distance)
    softcap = _rule(rules.softcap)
    max_nan = _rule(rules.max_nan)
    shift_of = _rule(rules.shift_of)
    rescale = _rule(rules.rescale)
    finalize = _rule(rules.finalize)
    rescale_exp2 = _rule(rules.rescale_exp2)


_KERNELS = {}


def make_kernel(Bc: int, D: int, Dv: int, exp2: bool = False):
    """The forward kernel for Bc keys per tile and head dims D, Dv.

    Shared and local arrays need their shapes when the kernel is compiled, so
    each (Bc, D, Dv) is its own kernel, built once and kept.  The number of
    threads (Br) is the launch's, read from ``cuda.blockDim.x``.

    ``exp2=True`` is chapter 10's second step: the same kernel working in
    base 2.  The host multiplies the scale, the softcap and the ALiBi slopes
    by log2(e) (softcap and ALiBi are linear in the score's unit), so scores
    arrive in log2 units, ``exp`` becomes ``exp2`` (one ``ex2.approx``
    instruction with ``fastmath``) and lse is converted back at the end.
    """
    key = (Bc, D, Dv, exp2)
    if key in _KERNELS:
        return _KERNELS[key]

    @cuda.jit(fastmath=exp2)
    def flash_forward_kernel(q, k, v, tiles, kv_head, scale, cap, alibi, slopes,
                             offset, left, right, out, lse):
        """q (B, H, Nq, D), k (B, Hk, Nk, D), v (B, Hk, Nk, Dv), tiles (Tr, Tc) int8 -> out, lse."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        Br = cuda.blockDim.x
        tr = cuda.blockIdx.x                       # which query tile
        b = cuda.blockIdx.y // H                   # which (batch, head)
        h = cuda.blockIdx.y % H
        kh = kv_head[h]                            # GQA / MQA: the K / V head this head reads
        t = cuda.threadIdx.x
        i = tr * Br + t                            # this thread's query row
        has_row = i < Nq                           # tail: the last tile's extra threads have none

        Kj = cuda.shared.array((Bc, D), float32)
        Vj = cuda.shared.array((Bc, Dv), float32)
        q_i = cuda.local.array(D, float32)         # this row of Q, kept for the whole kernel
        o_i = cuda.local.array(Dv, float32)        # its output accumulator (unnormalised)
        s_i = cuda.local.array(Bc, float32)        # its scores against the current tile
        m_i = float32(-math.inf)
        l_i = float32(0.0)
        slope = float32(slopes[b, h])
        for d in range(D):
            q_i[d] = float32(0.0)
            if has_row:
                q_i[d] = q[b, h, i, d]
        for e in range(Dv):
            o_i[e] = float32(0.0)

        for tc in range(tiles.shape[1]):
            kind = tiles[tr, tc]
            if kind == rules.EMPTY:                # the whole block skips it: nothing is loaded
                continue
            c0 = tc * Bc
            n_c = min(Bc, Nk - c0)                 # tail: the last key tile is short
            for x in range(t, n_c * D, Br):        # the block loads Kj together, coalesced
                Kj[x // D, x % D] = k[b, kh, c0 + x // D, x % D]
            for x in range(t, n_c * Dv, Br):
                Vj[x // Dv, x % Dv] = v[b, kh, c0 + x // Dv, x % Dv]
            cuda.syncthreads()                     # Kj, Vj complete before anyone reads them

            if has_row:
                m_new = m_i
                for c in range(n_c):               # S_ij = scale * q_i . Kj[c], and the tile's max
                    j = c0 + c
                    s = float32(0.0)
                    for d in range(D):
                        s += q_i[d] * Kj[c, d]
                    s = float32(softcap(s * scale, cap))
                    if alibi:
                        s -= slope * float32(alibi_rebased_distance(i, j, offset, Nk))
                    if kind == rules.PARTIAL and not visible(i, j, offset, left, right):
                        s = float32(-math.inf)
                    s_i[c] = s
                    m_new = max_nan(m_new, s)
                if exp2:
                    alpha = float32(rescale_exp2(m_i, m_new))
                else:
                    alpha = float32(rescale(m_i, m_new))   # the old max was this much too small
                shift = float32(shift_of(m_new))
                l_i *= alpha
                for e in range(Dv):
                    o_i[e] *= alpha
                for c in range(n_c):               # P_ij = exp(S_ij - m), l += rowsum, o += P Vj
                    p = rules.exp2(s_i[c] - shift) if exp2 else math.exp(s_i[c] - shift)
                    l_i += p
                    for e in range(Dv):
                        o_i[e] += p * Vj[c, e]
                m_i = m_new
            cuda.syncthreads()                     # everyone done with Kj, Vj before the next load

        if has_row:                                # divide by l once; write O and lse once
            row_lse, inv_l = finalize(m_i * float32(rules.LN2) if exp2 else m_i, l_i)
            lse[b, h, i] = row_lse
            for e in range(Dv):
                out[b, h, i, e] = o_i[e] * float32(inv_l)

    _KERNELS[key] = flash_forward_kernel
    return flash_forward_kernel


def _check_launch(q, v, Br, Bc):
    D, Dv = q.shape[3], v.shape[3]
    if not 1 <= Br <= MAX_THREADS:
        raise ValueError(f"block_q is the number of threads per block for flash_numba_cuda and must be "
                         f"at most {MAX_THREADS}, got {Br}")
    need = Bc * (D + Dv) * 4
    if need > SHARED_BYTES:
        fit = SHARED_BYTES // ((D + Dv) * 4)
        raise ValueError(f"block_k={Bc} with head dims {D} + {Dv} needs {need} bytes of shared memory, "
                         f"more than the {SHARED_BYTES} a block may use; use block_k <= {fit}")


def default_tile(D: int, Dv: int) -> tuple:
    """(Br, Bc) when the call gives none: ``launch.DEFAULT_TILES``' for a GPU or a simulator, with
    Bc halved until Kj and Vj fit in shared memory (64 keys: 32 at D = 128, 16 at 256)."""
    Br, Bc = host.DEFAULT_TILES["flash_numba_cuda" if on_gpu() else "flash_numba_cuda in a simulator"]
    while Bc > 1 and Bc * (D + Dv) * 4 > SHARED_BYTES:
        Bc //= 2
    return Br, Bc


@dataclass(frozen=True)
class Plan:
    """One launch, decided on the host: ``kernel[griddim, blockdim](q, k, v, *args, out, lse)``."""

    kernel: object
    griddim: tuple           # (Tr, B * H): a block per (query tile, batch x head)
    blockdim: int            # Br threads, one per query row
    args: tuple              # tiles, kv_head, scale, softcap, alibi, slopes, offset, left, right
    out_shape: tuple         # (B, H, Nq, Dv)
    launch: host.Launch


def plan(q, k, v, opts, mask, exp2: bool = False) -> Plan:
    """The kernel and its launch for validated dense float32 inputs (arrays only give shapes here).

    ``exp2``: chapter 10's base-2 variant (``make_kernel``); the scale, softcap
    and slopes it is launched with are in log2 units."""
    if q.dtype != np.float32:
        raise TypeError(f"flash_numba_cuda computes in float32 only; q, k and v are {q.dtype}: "
                        f"convert them with .astype(np.float32), or use impl='flash_numba_cpu'")
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, *default_tile(D, Dv))[0]
    _check_launch(q, v, launch.Br, launch.Bc)
    unit = rules.LOG2E if exp2 else 1.0
    args = (launch.tiles, launch.kv_head, np.float32(launch.softmax_scale * unit),
            np.float32(launch.softcap * unit), launch.alibi, (launch.slopes * unit).astype(np.float32),
            launch.offset, launch.left, launch.right)
    return Plan(make_kernel(launch.Bc, D, Dv, exp2), (launch.tiles.shape[0], B * H), launch.Br, args,
                (B, H, Nq, Dv), launch)


def flash_forward(q, k, v, opts, mask):
    """The CUDA forward for validated dense inputs: (out, lse), both float32."""
    p = plan(q, k, v, opts, mask)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    runner = where()
    work, limit = B * H * Nq * Nk * (D + Dv), sim_max_work()
    if runner != "gpu" and work > limit:
        seconds = SIM_SECONDS_PER_UNIT[runner] * limit
        raise ValueError(f"flash_numba_cuda runs in the {runner} here (no GPU), which takes only small "
                         f"problems: B*H*Nq*Nk*(D+Dv) = {work} is above {limit} (about {seconds:.0f} s of "
                         f"{runner} on the course's machine); shrink the shapes (q {q.shape}, k {k.shape}), "
                         f"run on a GPU, or raise the limit: {SIM_MAX_WORK_VARIABLE}={work} in the environment")
    qa, ka, va = (np.ascontiguousarray(x) for x in (q, k, v))
    out = np.zeros(p.out_shape, dtype=np.float32)
    lse = np.zeros(p.out_shape[:3], dtype=np.float32)
    if runner == "cudacheck":   # the inputs go in as device copies: nothing is written back into them
        from .. import cudacheck
        inputs = [cudacheck.to_device(a) if isinstance(a, np.ndarray) else a for a in (qa, ka, va, *p.args)]
        report = cudacheck.check(p.kernel, p.griddim, p.blockdim, *inputs, out, lse)
        if not report.ok:
            raise RuntimeError(f"flash_numba_cuda's kernel failed its check:\n{report}")
    else:   # a GPU or numba's simulator: inputs copied to the device, never back
        device_args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in (qa, ka, va, *p.args)]
        d_out, d_lse = cuda.device_array_like(out), cuda.device_array_like(lse)
        p.kernel[p.griddim, p.blockdim](*device_args, d_out, d_lse)
        out, lse = d_out.copy_to_host(), d_lse.copy_to_host()
    # The NaN rule, on the host like every impl: a NaN in V reaches rows that
    # cannot see its key through 0 * NaN, and such a row must not report an
    # lse that looks healthy.
    lse = lse_of_rebased(lse, opts, mask)   # the kernel summed ALiBi's rebased scores
    return out, nan_lse_where_out_is_nan(out, lse).astype(rules.lse_dtype(q.dtype), copy=False)


attention_forward = flash_forward
