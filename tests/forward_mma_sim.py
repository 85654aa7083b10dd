"""Run by tests/test_tensor_core_sim.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (numba's simulator must be
chosen before numba is imported): every version of the tensor-core forward (chapter 11's chain, ``versions``)
for every kind of operand, its instructions emulated by ``tensor_cores.sim``, on chapter 10's awkward cases
(``bench.cases.FORWARD_CASES``: tails, Nq != Nk, odd head dims, GQA / MQA, windows, softcap + ALiBi, rows that
see no key, split-KV, decode), checked against the float64 reference as the GPU's ``gpu_mma.py --parts
check`` checks them; the emulated mma_tf32, ldmatrix and cp.async against numpy; and four planted mistakes.
One JSON line of verdicts on stdout.

Tilings of two warps and 16 or 32 keys (the GPU's are 4-8 warps and 32-64 keys): the same code with every
tile boundary, tail and edge reached at shapes the simulator finishes in seconds.  ``tf32x1`` (one TF32
product) is held to float32's rule like the others and is expected to fail it, as on the GPU: it is the
step that shows why 3xTF32.
"""
import contextlib
import io
import itertools
import json
import sys

import numpy as np
from numba import cuda

from course_lib import checks
from course_lib.bench.cases import FORWARD_CASES, with_slopes
from course_lib.bench.timing import verdict
from course_lib.core import reference, rules
from course_lib.core.options import call_forward
from course_lib.kernels import tensor_cores as tc
from course_lib.kernels.tensor_cores import MmaTiling, layout, mma
from course_lib.kernels.tensor_cores import forward as tf
from course_lib.kernels.tensor_cores import sim as mma_sim

# version: a small tiling of it (``forward.version_of`` names the version a tiling runs)
VERSIONS = {
    "plain": MmaTiling(warps=2, Bc=16, staged=False, prefetch=False),
    "staged": MmaTiling(warps=2, Bc=32, staged=True, prefetch=False),
    "prefetch": MmaTiling(warps=2, Bc=16, staged=True, prefetch=True),
    "ldmatrix": MmaTiling(warps=2, Bc=32, ldmatrix=True, prefetch=False),
    "cp_async": MmaTiling(warps=2, Bc=16, ldmatrix=True, stages=2, prefetch=False),
    "split_once": MmaTiling(warps=2, Bc=32, ldmatrix=True, stages=2, prefetch=False, split_once=True),
    "q_shared": MmaTiling(warps=2, Bc=16, ldmatrix=True, stages=2, prefetch=False, q_shared=True),
}
# kind: (step, input dtype)
KINDS = {"f16": ("mma_f16", "float16"), "bf16": ("mma_f16", "bfloat16"), "tf32x1": ("mma_tf32", "float32"),
         "tf32x3": ("mma_3xtf32", "float32")}


def tiling_for(version, kind):
    """The version's tiling for ``kind``: 3xTF32's cp.async-based steps split A once (``q_shared`` asks it)."""
    tiling = VERSIONS[version]
    if version == "q_shared" and kind == "tf32x3":
        tiling = MmaTiling(**{**tiling.__dict__, "split_once": True})
    return tiling


def runs(version, kind):
    """Whether ``make_mma_kernel`` builds ``version`` for ``kind`` (split_once is 3xTF32's alone)."""
    return version != "split_once" or kind == "tf32x3"


def run_case(version, kind, name, seed=0):
    step, dtype = KINDS[kind]
    B, H, Hk, Nq, Nk, D, Dv, options, splits = FORWARD_CASES[name]
    dt = rules.ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32).astype(dt)
               for s in ((B, H, Nq, D), (B, Hk, Nk, D), (B, Hk, Nk, Dv)))
    opts = with_slopes(options)
    tiling = None if version == "default" else tiling_for(version, kind)

    def go():
        out, lse = tc.attention(q, k, v, step=step, tiling=tiling, splits=splits, return_lse=True, **opts)
        assert out.dtype == q.dtype, f"FAIL out is {out.dtype}, not the input's {q.dtype}"
        if kind == "tf32x1":
            within_tf32(out, q, k, v, opts)
        checks.check_attention(out, q, k, v, lse=lse, **opts)
        if name == "empty_rows":      # rows that see no key: out 0, lse -inf
            assert np.isneginf(lse[:, :, Nk:]).all() and (out[:, :, Nk:] == 0).all(), "FAIL a row that saw no key"
    return verdict(go)


TF32_BOUND = 8 * 2.0 ** -11     # a few of tf32's unit roundoffs (10 mantissa bits) on |out| <= max |v|


def within_tf32(out, q, k, v, opts):
    """One TF32 product rounds Q, K, P and V to 10 mantissa bits: its error must stay at that level.  Within
    it, float32's rule is then tried (and expected to fail, with "float32's rule" in the verdict)."""
    want = call_forward(reference.attention_forward, *(x.astype(np.float64) for x in (q, k, v)), **opts)
    err = float(np.nanmax(np.abs(out.astype(np.float64) - want), initial=0.0))
    assert err <= TF32_BOUND * max(1.0, float(np.abs(v).max())), f"FAIL beyond TF32's rounding: {err:.3g}"
    try:
        checks.check_attention(out, q, k, v, **opts)
    except checks.CheckFailed:
        raise AssertionError(f"FAIL float32's rule, within TF32's rounding ({err:.2e})") from None


def plan():
    """(version, kind, case) of the sweep: every version for every kind on one case, the cases taken in turn
    so that each meets several versions and kinds (3xTF32, three products each, the quicker ones); ALiBi far
    from the diagonal (256 rows: the slowest here) once; the default tilings (what the GPU ran: 4 warps and
    64 keys, or decode's one warp and its packed GQA heads) of halves on two cases and of 3xTF32 on one."""
    slow = "alibi_far_from_the_diagonal_mqa"
    names = [n for n in FORWARD_CASES if n != slow]
    quick = [n for n in names if n not in ("tails_gqa_causal", "decode_split_kv")]
    todo, turns = [], {False: itertools.cycle(names), True: itertools.cycle(quick)}
    for version in VERSIONS:
        for kind in KINDS:
            if runs(version, kind):
                todo.append((version, kind, next(turns[kind == "tf32x3"])))
    todo.append(("cp_async", "bf16", slow))
    todo += [("default", "f16", "softcap_alibi_causal_top_left"), ("default", "f16", "decode_split_kv"),
             ("default", "tf32x3", "split_kv_causal")]
    return todo


# -- the emulated instructions, one at a time, against numpy -----------------------------------------

def one_warp_mma(op, aw, bw, c):
    """D (16 x 8, float32) of one emulated ``op`` (``sim``'s mma_f16 / mma_bf16 / mma_tf32), run by a warp of
    32 threads in the simulator (the backward's sweep calls it too): A's words ``aw`` (16 x 8), B's ``bw``
    (8 x 8, n by k) and C ``c`` handed to each lane, and D read back, by the PTX ISA's fragment tables."""
    @cuda.jit
    def one_mma(aw, bw, c, d):
        lane = cuda.threadIdx.x
        a = [aw[mma.a_word(lane, r)] for r in range(4)]
        b = [bw[mma.b_word(lane, r)] for r in range(2)]
        cc = [c[mma.c_elem(lane, r)] for r in range(4)]
        out = op(a[0], a[1], a[2], a[3], b[0], b[1], cc[0], cc[1], cc[2], cc[3])
        for r in range(4):
            d[mma.c_elem(lane, r)] = out[r]
    d = np.zeros((16, 8), np.float32)
    one_mma[1, 32](aw, bw, c, d)
    return d


def tf32_unit(seed=3):
    """One warp's m16n8k8 on tf32 words through ``sim`` against float64's product of the tf32 values."""
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    aw, bw = A.view(np.uint32), B.view(np.uint32)
    D = one_warp_mma(mma_sim.mma_tf32, aw, bw, C)
    truncated = lambda x: (x.view(np.uint32) & np.uint32(mma_sim.TF32_BITS)).view(np.float32).astype(np.float64)
    want = truncated(A) @ truncated(B).T + C
    err = float(np.max(np.abs(D - want)))
    return "PASS" if err <= 1e-6 * float(np.max(np.abs(want))) else f"FAIL mma_tf32: max error {err:.3g}"


def ldmatrix_unit(trans, seed=5):
    """ldmatrix.x4 through ``sim``: four 8 x 8 matrices of halves at scattered rows of a shared tile; lane
    L's register j against ``mma.ldmatrix_word``'s (row, word) of matrix j, or its transposed pair."""
    rng = np.random.default_rng(seed)
    halves = rng.standard_normal(512).astype(np.float16)
    tile_words = halves.view(np.uint32)                 # 256 words; a row is 4 of them (8 halves)
    starts = 4 * rng.permutation(64)[:32]               # lane i's row: anywhere, 16-byte aligned
    got = np.zeros((32, 4), np.uint32)
    op = mma_sim.ldmatrix_x4_trans if trans else mma_sim.ldmatrix_x4

    @cuda.jit
    def load(words, starts, got):
        tile = cuda.shared.array(256, np.uint32)
        lane = cuda.threadIdx.x
        for i in range(8):
            tile[8 * lane + i] = words[8 * lane + i]
        cuda.syncthreads()
        r = op(tile, starts[lane])
        for j in range(4):
            got[lane, j] = r[j]
    load[1, 32](tile_words, starts, got)
    for lane in range(32):
        for j in range(4):
            if trans:
                row0, row1, col = mma.ldmatrix_word(lane, j, trans=True)
                want = [halves[2 * starts[8 * j + r] + col] for r in (row0, row1)]
            else:
                row, w = mma.ldmatrix_word(lane, j)
                want = list(halves[2 * (starts[8 * j + row] + w):2 * (starts[8 * j + row] + w) + 2])
            have = list(np.array([got[lane, j]], np.uint32).view(np.float16))
            if have != want:
                return f"FAIL ldmatrix{'.trans' if trans else ''}: lane {lane} register {j} holds {have}, not {want}"
    return "PASS"


def cp_async_unit():
    """cp.async through ``sim``: 16 bytes from a flat word offset of a 2-D source, zeros past nbytes."""
    src = np.arange(40, dtype=np.uint32).reshape(5, 8)
    got = np.full((3, 4), 99, np.uint32)

    @cuda.jit
    def copy(src, got):
        tile = cuda.shared.array(12, np.uint32)
        if cuda.threadIdx.x == 0:
            mma_sim.cp_async16(tile, 0, src, 9, 16)
            mma_sim.cp_async16(tile, 4, src, 36, 8)
            mma_sim.cp_async16(tile, 8, src, 0, 0)
            mma_sim.cp_async_commit()
            mma_sim.cp_async_wait0()
            for i in range(12):
                got[i // 4, i % 4] = tile[i]
    copy[1, 1](src, got)
    want = np.array([[9, 10, 11, 12], [36, 37, 0, 0], [0, 0, 0, 0]], np.uint32)
    return "PASS" if (got == want).all() else f"FAIL cp.async: {got.tolist()}, not {want.tolist()}"


# -- the check must fail on each --------------------------------------------------------------------

def planted(kind):
    """A mistake a kernel writer makes, planted; the sweep's check must FAIL it: P's A registers packed in the
    wrong order (``layout.HALF_A``'s second and third swapped, a misreading of the PTX ISA's figure); V's B
    fragments by a plain ldmatrix instead of a transposed one; a row's max over two of its quad's four lanes
    (the second shuffle forgotten); the mask forgotten on the tiles (every tile FULL)."""
    real_half, real_trans, real_shfl, real_prepare = layout.HALF_A, mma_sim.ldmatrix_x4_trans, \
        mma_sim.shfl_xor_sync, tf.host.prepare
    version, case = "ldmatrix", "tails_gqa_causal"
    if kind == "half_a_swapped":
        import course_lib.kernels.tensor_cores.fragments as fr
        fr.HALF_A = (real_half[0], real_half[2], real_half[1], real_half[3])
    elif kind == "v_not_transposed":
        mma_sim.ldmatrix_x4_trans = mma_sim.ldmatrix_x4
    elif kind == "one_shuffle":
        mma_sim.shfl_xor_sync = lambda mask, value, lane_mask: (
            real_shfl(mask, value, lane_mask) if lane_mask != 2 else real_shfl(mask, value, 0))
    elif kind == "mask_forgotten":
        def everything_full(*args, **kw):
            launch, *rest = real_prepare(*args, **kw)
            launch.tiles[...] = np.where(launch.tiles == rules.PARTIAL, rules.FULL, launch.tiles)
            return (launch, *rest)
        tf.host.prepare = everything_full
        version, case = "cp_async", "tails_gqa_causal"   # key tile 0 is PARTIAL and not at the edge
    tf._KERNELS.clear()
    try:
        return run_case(version, "f16", case, seed=1)
    finally:
        import course_lib.kernels.tensor_cores.fragments as fr
        fr.HALF_A, mma_sim.ldmatrix_x4_trans, mma_sim.shfl_xor_sync, tf.host.prepare = \
            real_half, real_trans, real_shfl, real_prepare
        tf._KERNELS.clear()


if __name__ == "__main__":
    only = sys.argv[1:]      # a few "version/kind/case" to run alone (by hand); nothing: the whole sweep
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):   # the checks print their verdicts; we keep ours
        for version, kind, name in plan():
            key = f"{version}/{kind}/{name}"
            if not only or key in only:
                results[key] = run_case(version, kind, name)
        if not only:
            results["unit/mma_tf32"] = tf32_unit()
            results["unit/ldmatrix"] = ldmatrix_unit(False)
            results["unit/ldmatrix_trans"] = ldmatrix_unit(True)
            results["unit/cp_async"] = cp_async_unit()
            for kind in ("half_a_swapped", "v_not_transposed", "one_shuffle", "mask_forgotten"):
                results[f"planted/{kind}"] = planted(kind)
    print(json.dumps(results))
