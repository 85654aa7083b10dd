"""Can Numba reach Hopper's own instructions?  sm_90a code (wgmma, setmaxnreg), TMA and mbarrier from Python.

    python benchmarks/hopper_reach.py --out notebooks/records/hopper_reach.jsonl [--checks NAME ...]

Needs an H100 or H200 and numba-cuda; a probe, not a test.  Each check runs in its own process (an illegal
instruction poisons the CUDA context for good), prints PASS or FAIL and appends one JSON line to --out with the
card, the driver, numba-cuda's version, the build path tried and what came of it.

- ``fence_jit``: a plain ``cuda.jit`` kernel of ``wgmma.fence`` / ``commit_group`` / ``wait_group`` on one
  warpgroup (128 threads).  Records the ``.target`` of the PTX the launch actually uses (the code library's
  default, ``cc=None``) beside the one ``inspect_asm`` shows (which passes the device's bare (9, 0)), the cc keys
  of the cubins built and the architecture cuobjdump reads off the cubin.
- ``fence_jit_warp``: the same kernel launched on one warp (32 threads): an incomplete warpgroup.
- ``fence_ptx_driver``: ``cuda.compile_ptx(..., cc=(9, 0, "a"))``, loaded with ``cuModuleLoadDataEx`` (ctypes on
  libcuda) and launched with ``cuLaunchKernel``; then the same PTX with its target edited to ``sm_90``, to record
  what the driver's PTX compiler says.
- ``setmaxnreg``: ``setmaxnreg.dec`` / ``.inc`` under a register cap (``max_registers``), one warpgroup.
- ``wgmma``: one ``wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16``, A (64 x 16) and B (16 x 8, stored
  K-major) in shared memory as 8 x 8 core matrices (no swizzle), read through two 64-bit matrix descriptors
  built in the kernel; D against numpy in float64.  Both readings of the descriptor's two offsets are tried
  (leading = along K, stride = along M / N, and the reverse): the record says which one the hardware takes.
- ``tma``: a 2-D float32 tensor map made on the host (``cuTensorMapEncodeTiled`` through ctypes), copied to
  global memory, one ``cp.async.bulk.tensor.2d`` of a 32 x 16 box into shared memory completing on an
  ``mbarrier`` (``arrive.expect_tx`` / ``try_wait.parity``); a box inside the tensor and one hanging over its
  corner (zero fill) against numpy.
- ``tma_param_ptx``: CUDA C++'s way, the descriptor passed by value as a 64-byte aligned 128-byte kernel
  parameter (what ``__grid_constant__`` gives): a kernel written in PTX by hand (Numba cannot declare such a
  parameter), loaded with ``cuModuleLoadDataEx`` and launched with ``cuLaunchKernel`` from ctypes.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

CHECKS = ("fence_jit", "fence_jit_warp", "fence_ptx_driver", "setmaxnreg", "wgmma", "tma", "tma_param_ptx")


# -- what every record carries -------------------------------------------------------------

def environment():
    import importlib.metadata as md

    from numba import cuda
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    drv = ctypes.c_int()
    _libcuda().cuDriverGetVersion(ctypes.byref(drv))
    env = {"gpu": name, "cc": list(dev.compute_capability),
           "cuda_driver_api": f"{drv.value // 1000}.{drv.value % 1000 // 10}"}
    for pkg in ("numba", "numba-cuda", "cuda-bindings", "cuda-core", "nvidia-nvjitlink", "numpy"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    return env


_LIB = None


def _libcuda():
    global _LIB
    if _LIB is None:
        _LIB = ctypes.CDLL("libcuda.so.1")
    return _LIB


def _ptx_target(ptx):
    m = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    return m.group(1) if m else None


def _cubin_facts(cubin):
    """The architecture cuobjdump reads off a cubin and how many of Hopper's instructions its SASS holds."""
    facts = {}
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(bytes(getattr(cubin, "code", cubin)))         # cuda.core's ObjectCode holds the bytes in .code
        path = f.name
    try:
        sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, timeout=60).stdout
        facts["cuobjdump_arch"] = sorted(set(re.findall(r"arch = (\S+)", sass)))
        for op in ("WARPGROUP", "HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"):
            facts[f"sass_{op}"] = len(re.findall(rf"\b{op}", sass))
    except (OSError, subprocess.SubprocessError) as e:
        facts["cuobjdump_error"] = repr(e)
    finally:
        os.unlink(path)
    return facts


def _library_facts(kernel, sig):
    """How the launch's code was built: the PTX target of the default path, inspect_asm's, the cubins' cc keys."""
    over = kernel.overloads.get(sig) or next(iter(kernel.overloads.values()))
    sig = over.argument_types if hasattr(over, "argument_types") else sig
    lib = over._codelibrary
    facts = {"ptx_target_default": _ptx_target(lib.get_asm_str()),
             "ptx_target_inspect_asm": _ptx_target(kernel.inspect_asm(sig)),
             "cubin_cc_keys": [list(k) for k in lib._cubin_cache]}
    for cc, cubin in lib._cubin_cache.items():
        facts.update(_cubin_facts(cubin))
        try:
            facts["linker_info"] = str(lib.get_linkerinfo(cc))[-400:]
        except Exception:  # noqa: BLE001 - the log is a nicety, not the finding
            pass
    return facts


# -- inline PTX, the course's way (numba.cuda.extending.intrinsic + llvmlite's InlineAsm) -------------

def _intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    def asm(builder, ret, args, text, constraints):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)

    def bare(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                asm(builder, ir.VoidType(), [], text, "~{memory}")
                return context.get_dummy_value()
            return types.void(), codegen
        return op

    def shared_base(context, builder, aryty, ary):
        a = context.make_array(aryty)(context, builder, ary)
        generic = builder.ptrtoint(a.data, i64)
        return asm(builder, i32, [generic], "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }", "=r,l")

    @intrinsic
    def shared_addr(typingctx, ary):
        """The 32-bit shared-window address of a shared array's first element."""
        def codegen(context, builder, sig, args):
            return shared_base(context, builder, sig.args[0], args[0])
        return types.uint32(ary), codegen

    @intrinsic
    def global_addr(typingctx, ary):
        """The (generic) address of a global array's first element."""
        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, args[0])
            return builder.ptrtoint(a.data, i64)
        return types.uint64(ary), codegen

    def u32_pair(text):
        """An instruction on a 32-bit shared address and one 32-bit value."""
        @intrinsic
        def op(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
                asm(builder, ir.VoidType(), vals, text, "r,r,~{memory}")
                return context.get_dummy_value()
            return types.void(addr, value), codegen
        return op

    mbar_init = u32_pair("mbarrier.init.shared::cta.b64 [$0], $1;")
    mbar_expect_tx = u32_pair("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")
    mbar_wait = u32_pair("{ .reg .pred P1; LAB_WAIT: mbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1; "
                         "@P1 bra DONE; bra LAB_WAIT; DONE: }")

    @intrinsic
    def tma_load_2d(typingctx, dst, tmap, c0, c1, bar):
        """One bulk tensor copy of a 2-D box at (c0 innermost, c1) into shared ``dst``, completing on ``bar``."""
        def codegen(context, builder, sig, args):
            d, b = (context.cast(builder, args[i], sig.args[i], types.uint32) for i in (0, 4))
            x, y = (context.cast(builder, args[i], sig.args[i], types.int32) for i in (2, 3))
            t = context.cast(builder, args[1], sig.args[1], types.uint64)
            asm(builder, ir.VoidType(), [d, t, x, y, b],
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                "[$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}")
            return context.get_dummy_value()
        return types.void(dst, tmap, c0, c1, bar), codegen

    @intrinsic
    def tensormap_acquire(typingctx, tmap):
        """Order the host's write of the descriptor in global memory before the copy engine reads it."""
        def codegen(context, builder, sig, args):
            t = context.cast(builder, args[0], sig.args[0], types.uint64)
            asm(builder, ir.VoidType(), [t], "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;",
                "l,~{memory}")
            return context.get_dummy_value()
        return types.void(tmap), codegen

    @intrinsic
    def wgmma_m64n8k16(typingctx, desc_a, desc_b):
        """D (64 x 8 f32, 4 a thread) = A B from two shared-memory descriptors, fenced, committed and waited for
        in one asm statement so that no other instruction touches the accumulators while the product is in
        flight.  scale-d = 0: D is A B (no C)."""
        def codegen(context, builder, sig, args):
            a, b = (context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args))
            text = ("{ .reg .pred p; setp.ne.b32 p, $6, 0; wgmma.fence.sync.aligned; "
                    "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {$0,$1,$2,$3}, $4, $5, p, 1, 1, 0, 0; "
                    "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; }")
            d = asm(builder, ir.LiteralStructType([f32] * 4), [a, b, ir.Constant(i32, 0)], text,
                    "=f,=f,=f,=f,l,l,r,~{memory}")
            tup = types.UniTuple(types.float32, 4)
            return context.make_tuple(builder, tup, [builder.extract_value(d, i) for i in range(4)])
        return types.UniTuple(types.float32, 4)(desc_a, desc_b), codegen

    @intrinsic
    def float_of(typingctx, w):
        def codegen(context, builder, sig, args):
            return asm(builder, f32, [context.cast(builder, args[0], sig.args[0], types.uint32)],
                       "mov.b32 $0, $1;", "=f,r")
        return types.float32(w), codegen

    return {
        "wgmma_fence_commit_wait": bare("wgmma.fence.sync.aligned; wgmma.commit_group.sync.aligned; "
                                        "wgmma.wait_group.sync.aligned 0;"),
        "setmaxnreg_dec": bare("setmaxnreg.dec.sync.aligned.u32 40;"),
        "setmaxnreg_inc": bare("setmaxnreg.inc.sync.aligned.u32 64;"),
        "fence_proxy_async": bare("fence.proxy.async.shared::cta;"),
        "fence_mbarrier_init": bare("fence.mbarrier_init.release.cluster;"),
        "shared_addr": shared_addr, "global_addr": global_addr, "mbar_init": mbar_init,
        "mbar_expect_tx": mbar_expect_tx, "mbar_wait": mbar_wait, "tma_load_2d": tma_load_2d,
        "tensormap_acquire": tensormap_acquire, "wgmma_m64n8k16": wgmma_m64n8k16, "float_of": float_of,
    }


# -- the checks: each returns a dict with "pass" and what it found --------------------------------------------

def _fence_kernel(ops):
    from numba import cuda

    fence = ops["wgmma_fence_commit_wait"]

    @cuda.jit
    def fence_kernel(flag):
        fence()
        if cuda.threadIdx.x == 0:
            flag[0] = 1
    return fence_kernel


def check_fence_jit(threads=128):
    from numba import cuda, types
    ops = _intrinsics()
    k = _fence_kernel(ops)
    sig = (types.int32[::1],)
    flag = cuda.to_device(np.zeros(1, np.int32))
    out = {"tried": f"cuda.jit, default build, launched [1, {threads}]"}
    try:
        k[1, threads](flag)
        cuda.synchronize()
        out["ran"] = bool(flag.copy_to_host()[0] == 1)
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["ran"] = False
        out["error"] = f"{type(e).__name__}: {e}"[:600]
    try:
        out.update(_library_facts(k, sig))
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["facts_error"] = f"{type(e).__name__}: {e}"[:300]
    out["pass"] = out["ran"]
    return out


def check_fence_jit_warp():
    return check_fence_jit(threads=32)


def _load_ptx(ptx):
    """cuModuleLoadDataEx on PTX text, with the driver's PTX compiler log: (result, module, log)."""
    lib = _libcuda()
    mod = ctypes.c_void_p()
    logsize = 8192
    log = ctypes.create_string_buffer(logsize)
    opts = (ctypes.c_int * 2)(5, 6)             # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
    vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(logsize))
    rc = lib.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(ptx.encode() + b"\0"), 2, opts, vals)
    return rc, mod, log.value.decode(errors="replace")


def check_fence_ptx_driver():
    from numba import cuda
    ops = _intrinsics()
    fence = ops["wgmma_fence_commit_wait"]

    def fence_only():
        fence()

    ptx, _ = cuda.compile_ptx(fence_only, (), cc=(9, 0, "a"))
    entry = re.search(r"\.entry\s+(\S+)\s*\(", ptx).group(1)
    out = {"tried": "cuda.compile_ptx(cc=(9,0,'a')) -> cuModuleLoadDataEx -> cuLaunchKernel [1,128]",
           "ptx_target": _ptx_target(ptx), "ptx_version": re.search(r"^\.version\s+(\S+)", ptx, re.M).group(1)}
    cuda.current_context()                     # numba's primary context is current on this thread
    lib = _libcuda()
    rc, mod, log = _load_ptx(ptx)
    out["load_rc"] = rc
    if rc == 0:
        fn = ctypes.c_void_p()
        out["getfunction_rc"] = lib.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode())
        out["launch_rc"] = lib.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, None, None, None)
        out["sync_rc"] = lib.cuCtxSynchronize()
        out["ran"] = out["launch_rc"] == 0 and out["sync_rc"] == 0
    else:
        out["ran"] = False
        out["load_log"] = log[-600:]
    plain = re.sub(r"^\.target\s+sm_90a", ".target sm_90", ptx, flags=re.M)
    rc90, _, log90 = _load_ptx(plain)
    out["same_ptx_target_sm_90"] = {"load_rc": rc90, "log": log90[-600:]}
    out["pass"] = out["ran"]
    return out


def check_setmaxnreg():
    from numba import cuda, types
    ops = _intrinsics()
    dec, inc = ops["setmaxnreg_dec"], ops["setmaxnreg_inc"]

    @cuda.jit(max_registers=64)
    def regs(flag):
        if cuda.threadIdx.x < 128:
            dec()
        else:
            inc()
        if cuda.threadIdx.x == 0:
            flag[0] = 1

    sig = (types.int32[::1],)
    flag = cuda.to_device(np.zeros(1, np.int32))
    out = {"tried": "cuda.jit(max_registers=64), setmaxnreg.dec 40 in warpgroup 0, .inc 64 in warpgroup 1, [1,256]"}
    try:
        regs[1, 256](flag)
        cuda.synchronize()
        out["ran"] = bool(flag.copy_to_host()[0] == 1)
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["ran"] = False
        out["error"] = f"{type(e).__name__}: {e}"[:600]
    try:
        out.update(_library_facts(regs, sig))
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["facts_error"] = f"{type(e).__name__}: {e}"[:300]
    out["pass"] = out["ran"]
    return out


# wgmma operands: 8 x 8 core matrices of halves, each 8 rows of 16 contiguous bytes (128 bytes), no swizzle.
CORE_K_STRIDE = 128      # bytes between core matrices neighbouring along K
CORE_MN_STRIDE = 256     # bytes between core matrices neighbouring along M (A) or N (B)


def core_words(mat):
    """A K-major (rows x K) float16 matrix laid out as core matrices: core (i, j) holds rows 8i..8i+7 and
    columns 8j..8j+7, at byte i * CORE_MN_STRIDE + j * CORE_K_STRIDE; returned as uint32 words."""
    rows, k = mat.shape
    nbytes = (rows // 8 - 1) * CORE_MN_STRIDE + (k // 8 - 1) * CORE_K_STRIDE + 128
    buf = np.zeros(nbytes // 2, np.float16)
    for i in range(rows // 8):
        for j in range(k // 8):
            base = (i * CORE_MN_STRIDE + j * CORE_K_STRIDE) // 2
            buf[base:base + 64] = mat[8 * i:8 * i + 8, 8 * j:8 * j + 8].reshape(-1)
    return buf.view(np.uint32)


def d_elem(thread, reg):
    """wgmma m64nNk16's f32 accumulator: float ``reg`` of ``thread`` (of 128) is D's (row, column)."""
    warp, lane = thread >> 5, thread & 31
    return 16 * warp + (lane >> 2) + 8 * ((reg >> 1) & 1), 2 * (lane & 3) + (reg & 1) + 8 * (reg >> 2)


def descriptor_fields(lbo, sbo):
    """The 64-bit shared-memory matrix descriptor without its start address: offsets >> 4 at bits 16 and 32,
    base offset 0, swizzle 0 (none) in bits 62-63."""
    return ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32


def wgmma_py(ops, n_a, n_b):
    """One warpgroup: A's and B's words into 128-byte aligned shared memory, the async-proxy fence, one wgmma;
    thread t writes its four accumulators to out[4t:4t+4]."""
    from numba import cuda, uint32, uint64
    shared_addr, fence_proxy, mma = ops["shared_addr"], ops["fence_proxy_async"], ops["wgmma_m64n8k16"]

    def wgmma_kernel(a_words, b_words, fields_a, fields_b, out):
        sm = cuda.shared.array(1024, uint32)
        t = cuda.threadIdx.x
        base = shared_addr(sm)
        pad = ((128 - (base & 127)) & 127) >> 2                 # words to the first 128-byte boundary
        for i in range(t, n_a, 128):
            sm[pad + i] = a_words[i]
        for i in range(t, n_b, 128):
            sm[pad + 512 + i] = b_words[i]
        fence_proxy()                                           # ordinary stores, then the async proxy reads
        cuda.syncthreads()
        start_a = uint64(base + 4 * pad)
        start_b = uint64(base + 4 * (pad + 512))
        da = fields_a | ((start_a >> uint64(4)) & uint64(0x3FFF))
        db = fields_b | ((start_b >> uint64(4)) & uint64(0x3FFF))
        d0, d1, d2, d3 = mma(da, db)
        out[4 * t] = d0
        out[4 * t + 1] = d1
        out[4 * t + 2] = d2
        out[4 * t + 3] = d3
    return wgmma_kernel


def check_wgmma():
    from numba import cuda
    ops = _intrinsics()
    rng = np.random.default_rng(47)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    bt = rng.standard_normal((8, 16)).astype(np.float16)       # B (16 x 8) stored K-major: n rows of k
    ref = a.astype(np.float64) @ bt.astype(np.float64).T
    aw, bw = core_words(a), core_words(bt)
    wgmma_kernel = cuda.jit(wgmma_py(ops, aw.size, bw.size))

    out = {"tried": "cuda.jit, wgmma.mma_async m64n8k16 f32.f16.f16, A and B K-major in shared memory, "
                    "no swizzle, 8x8 core matrices (K stride 128 B, M/N stride 256 B), [1,128]",
           "variants": {}}
    d_a, d_b = cuda.to_device(aw), cuda.to_device(bw)
    ok = False
    for name, (lbo, sbo) in {"leading=K,stride=MN": (CORE_K_STRIDE, CORE_MN_STRIDE),
                             "leading=MN,stride=K": (CORE_MN_STRIDE, CORE_K_STRIDE)}.items():
        v = {"lbo": lbo, "sbo": sbo}
        try:
            res = cuda.to_device(np.full(512, np.nan, np.float32))
            wgmma_kernel[1, 128](d_a, d_b, np.uint64(descriptor_fields(lbo, sbo)),
                                 np.uint64(descriptor_fields(lbo, sbo)), res)
            cuda.synchronize()
            flat = res.copy_to_host()
            d = np.full((64, 8), np.nan)
            for t in range(128):
                for r in range(4):
                    d[d_elem(t, r)] = flat[4 * t + r]
            v["all_written"] = bool(np.isfinite(flat).all())
            v["rel_err"] = float(np.linalg.norm(d - ref) / np.linalg.norm(ref)) if v["all_written"] else None
            v["same_values_any_order"] = bool(np.allclose(np.sort(flat), np.sort(ref.ravel()), rtol=1e-3, atol=1e-3))
            v["pass"] = v["rel_err"] is not None and v["rel_err"] < 1e-3
            ok |= v["pass"]
        except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
            v["pass"] = False
            v["error"] = f"{type(e).__name__}: {e}"[:600]
            out["variants"][name] = v
            break                                               # the context is gone after a launch error
        out["variants"][name] = v
    try:
        from numba import types
        sig = (types.uint32[::1], types.uint32[::1], types.uint64, types.uint64, types.float32[::1])
        out.update(_library_facts(wgmma_kernel, sig))
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["facts_error"] = f"{type(e).__name__}: {e}"[:300]
    out["pass"] = ok
    return out


def encode_tiled_2d(ptr, width, height, box_w, box_h):
    """A CUtensorMap (128 bytes, 16 uint64) for a row-major float32 (height x width) array at device ``ptr``:
    cuTensorMapEncodeTiled through ctypes; dims and box innermost first, no interleave, swizzle, L2 promotion
    or NaN fill (out-of-bounds elements read as zero)."""
    tmap = (ctypes.c_uint64 * 16)()
    dims = (ctypes.c_uint64 * 2)(width, height)
    strides = (ctypes.c_uint64 * 1)(width * 4)                  # bytes between rows; rank - 1 entries
    box = (ctypes.c_uint32 * 2)(box_w, box_h)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    FLOAT32 = 7
    rc = _libcuda().cuTensorMapEncodeTiled(tmap, FLOAT32, 2, ctypes.c_void_p(ptr), dims, strides, box, elem,
                                           0, 0, 0, 0)
    return rc, np.frombuffer(bytes(tmap), np.uint64).copy()


TMA_W, TMA_H, TMA_BOX_W, TMA_BOX_H = 64, 64, 32, 16


def tma_py(ops, nbox):
    """Thread 0 sets up the mbarrier, announces the bytes and issues the copy; every thread waits on phase 0
    and writes the box out."""
    from numba import cuda, uint32, uint64
    shared_addr, global_addr, mbar_init, expect_tx, mbar_wait, load, acquire, fence_init, float_of = (
        ops[k] for k in ("shared_addr", "global_addr", "mbar_init", "mbar_expect_tx", "mbar_wait", "tma_load_2d",
                         "tensormap_acquire", "fence_mbarrier_init", "float_of"))

    words = nbox + 32                                           # the box and room to align it to 128 bytes

    def tma_kernel(tmap, out, x0, y0):
        sm = cuda.shared.array(words, uint32)
        bar = cuda.shared.array(1, uint64)
        t = cuda.threadIdx.x
        base = shared_addr(sm)
        pad = ((128 - (base & 127)) & 127) >> 2
        b = shared_addr(bar)
        if t == 0:
            mbar_init(b, 1)
            fence_init()
        cuda.syncthreads()
        if t == 0:
            g = global_addr(tmap)
            acquire(g)
            expect_tx(b, nbox * 4)
            load(base + 4 * pad, g, x0, y0, b)
        mbar_wait(b, 0)
        for i in range(t, nbox, cuda.blockDim.x):
            out[i] = float_of(sm[pad + i])
    return tma_kernel


def check_tma():
    from numba import cuda
    ops = _intrinsics()
    W, H, BW, BH = TMA_W, TMA_H, TMA_BOX_W, TMA_BOX_H
    nbox = BW * BH
    tma_kernel = cuda.jit(tma_py(ops, nbox))
    rng = np.random.default_rng(11)
    src = rng.standard_normal((H, W)).astype(np.float32)
    d_src = cuda.to_device(src)
    rc, desc = encode_tiled_2d(d_src.device_ctypes_pointer.value, W, H, BW, BH)
    out = {"tried": "cuTensorMapEncodeTiled (ctypes on libcuda) -> descriptor copied to global memory (uint64[16]) "
                    "-> cuda.jit kernel: mbarrier.init, fence.proxy.tensormap::generic.acquire, "
                    "mbarrier.arrive.expect_tx, cp.async.bulk.tensor.2d (generic address of the descriptor), "
                    "mbarrier.try_wait.parity; [1,128]",
           "encode_rc": rc, "boxes": {}}
    if rc != 0:
        out["pass"] = False
        return out
    d_desc = cuda.to_device(desc)
    ok = True
    for x0, y0 in ((32, 16), (48, 56)):
        v = {}
        try:
            res = cuda.to_device(np.full(nbox, np.nan, np.float32))
            tma_kernel[1, 128](d_desc, res, np.int32(x0), np.int32(y0))
            cuda.synchronize()
            got = res.copy_to_host().reshape(BH, BW)
            ref = np.zeros((BH, BW), np.float32)
            part = src[y0:y0 + BH, x0:x0 + BW]
            ref[:part.shape[0], :part.shape[1]] = part
            v["max_abs_err"] = float(np.nanmax(np.abs(got - ref))) if np.isfinite(got).all() else None
            v["pass"] = bool(np.array_equal(got, ref))
        except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
            v["pass"] = False
            v["error"] = f"{type(e).__name__}: {e}"[:600]
        out["boxes"][f"x0={x0},y0={y0}"] = v
        ok &= v["pass"]
        if "error" in v:
            break
    try:
        from numba import types
        sig = (types.uint64[::1], types.float32[::1], types.int32, types.int32)
        out.update(_library_facts(tma_kernel, sig))
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        out["facts_error"] = f"{type(e).__name__}: {e}"[:300]
    out["pass"] = ok
    return out


def ptx_offline(out_dir):
    """No GPU: each kernel through ``compile_ptx(cc=(9, 0, "a"))`` and ptxas for sm_90a (and sm_90, to show what
    the plain target refuses); the PTX is written to ``out_dir``."""
    from numba import cuda, types
    ops = _intrinsics()
    fence = ops["wgmma_fence_commit_wait"]

    def fence_only():
        fence()

    kernels = {
        "fence": (fence_only, ()),
        "wgmma": (wgmma_py(ops, 256, 64), (types.uint32[::1], types.uint32[::1], types.uint64, types.uint64,
                                           types.float32[::1])),
        "tma": (tma_py(ops, TMA_BOX_W * TMA_BOX_H), (types.uint64[::1], types.float32[::1], types.int32,
                                                     types.int32)),
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, (fn, sig) in kernels.items():
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0, "a"))
        path = os.path.join(out_dir, f"hopper_reach_{name}.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        line = [f"{name}: .target {_ptx_target(ptx)}"]
        for arch in ("sm_90a", "sm_90"):
            text = ptx if arch == "sm_90a" else re.sub(r"^\.target\s+sm_90a", ".target sm_90", ptx, flags=re.M)
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(text)
            r = subprocess.run(["ptxas", f"-arch={arch}", f.name, "-o", os.devnull], capture_output=True, text=True)
            os.unlink(f.name)
            line.append(f"ptxas {arch}: rc {r.returncode} {r.stderr.strip()[:200]}")
        print(" | ".join(line))


TMA_PARAM_PTX = r"""
.version 8.0
.target sm_90a
.address_size 64
.visible .entry tma_param(.param .align 64 .b8 tmap[128], .param .u64 out, .param .u32 x0, .param .u32 y0)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    .reg .f32 %f<2>;
    .shared .align 128 .b8 box[2048];
    .shared .align 8 .b64 bar;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, bar;
    mov.u32 %r3, box;
    mov.u64 %rd1, tmap;
    cvta.param.u64 %rd1, %rd1;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra SYNC;
    mbarrier.init.shared::cta.b64 [%r2], 1;
    fence.mbarrier_init.release.cluster;
SYNC:
    bar.sync 0;
    @%p1 bra WAIT;
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], 2048;
    ld.param.u32 %r4, [x0];
    ld.param.u32 %r5, [y0];
    cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r3], [%rd1, {%r4, %r5}], [%r2];
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0;
    @!%p2 bra WAIT;
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r6, %r1;
LOOP:
    shl.b32 %r7, %r6, 2;
    add.u32 %r8, %r3, %r7;
    ld.shared.f32 %f1, [%r8];
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f1;
    add.u32 %r6, %r6, 128;
    setp.lt.u32 %p3, %r6, 512;
    @%p3 bra LOOP;
    ret;
}
"""


def check_tma_param_ptx():
    from numba import cuda
    W, H, BW, BH = TMA_W, TMA_H, TMA_BOX_W, TMA_BOX_H
    rng = np.random.default_rng(12)
    src = rng.standard_normal((H, W)).astype(np.float32)
    d_src = cuda.to_device(src)
    rc, desc = encode_tiled_2d(d_src.device_ctypes_pointer.value, W, H, BW, BH)
    out = {"tried": "hand-written PTX kernel, .param .align 64 .b8 tmap[128] (by value, cvta.param to a generic "
                    "address), cuModuleLoadDataEx + cuLaunchKernel through ctypes; [1,128]",
           "encode_rc": rc, "boxes": {}}
    lib = _libcuda()
    load_rc, mod, log = _load_ptx(TMA_PARAM_PTX)
    out["load_rc"] = load_rc
    if rc != 0 or load_rc != 0:
        out["load_log"] = log[-600:]
        out["pass"] = False
        return out
    fn = ctypes.c_void_p()
    out["getfunction_rc"] = lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"tma_param")
    ok = True
    for x0, y0 in ((32, 16), (48, 56)):
        res = cuda.to_device(np.full(BW * BH, np.nan, np.float32))
        tmap = (ctypes.c_uint64 * 16)(*[int(w) for w in desc])
        outp = ctypes.c_uint64(res.device_ctypes_pointer.value)
        cx, cy = ctypes.c_uint32(x0), ctypes.c_uint32(y0)
        params = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in (tmap, outp, cx, cy)])
        v = {"launch_rc": lib.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, None, params, None),
             "sync_rc": lib.cuCtxSynchronize()}
        if v["launch_rc"] == 0 and v["sync_rc"] == 0:
            got = res.copy_to_host().reshape(BH, BW)
            ref = np.zeros((BH, BW), np.float32)
            part = src[y0:y0 + BH, x0:x0 + BW]
            ref[:part.shape[0], :part.shape[1]] = part
            v["pass"] = bool(np.array_equal(got, ref))
        else:
            v["pass"] = False
        out["boxes"][f"x0={x0},y0={y0}"] = v
        ok &= v["pass"]
        if not v["pass"] and v["sync_rc"] != 0:
            break
    out["pass"] = ok
    return out


# -- driver ----------------------------------------------------------------------------------------------------

def run_one(name, out_path, run):
    t0 = time.time()
    rec = {"run": run, "benchmark": "hopper_reach", "check": name}
    try:
        rec["environment"] = environment()
        rec.update(globals()[f"check_{name}"]())
    except Exception as e:  # noqa: BLE001 - a probe records what failed, whatever it was
        rec["pass"] = False
        rec["error"] = f"{type(e).__name__}: {e}"[:800]
        rec["traceback"] = traceback.format_exc()[-1500:]
    rec["seconds"] = round(time.time() - t0, 2)
    with open(out_path, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    print(f"{'PASS' if rec.get('pass') else 'FAIL'} {name}: " + json.dumps(
        {k: v for k, v in rec.items() if k not in ("environment", "traceback", "benchmark", "check")},
        default=str)[:1500], flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="notebooks/records/hopper_reach.jsonl")
    p.add_argument("--checks", nargs="*", default=list(CHECKS), choices=CHECKS)
    p.add_argument("--one", choices=CHECKS, help=argparse.SUPPRESS)
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--ptx", metavar="DIR", help="no GPU: compile each kernel to sm_90a PTX in DIR and run ptxas")
    a = p.parse_args()
    if a.ptx:
        ptx_offline(a.ptx)
        return
    if a.one:
        run_one(a.one, a.out, a.run)
        return
    run = time.strftime("%Y%m%dT%H%M%S+0000", time.gmtime())
    for name in a.checks:
        try:
            subprocess.run([sys.executable, __file__, "--one", name, "--out", a.out, "--run", run], timeout=a.timeout)
        except subprocess.TimeoutExpired:
            with open(a.out, "a") as f:
                f.write(json.dumps({"run": run, "benchmark": "hopper_reach", "check": name, "pass": False,
                                    "error": f"timed out after {a.timeout} s (a wait that never completed)"}) + "\n")
            print(f"FAIL {name}: timed out after {a.timeout} s", flush=True)


if __name__ == "__main__":
    main()
