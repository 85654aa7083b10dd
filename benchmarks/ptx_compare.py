"""PTX for sm_90 of every chapter-10 kernel the H200 records ran, and of every tensor-core kernel of
chapters 11 and 12 (``dump_tensor_cores``), compiled off the GPU.

A committed GPU record stands for the code only while its kernels compile to the same
instructions; this tells, on a machine without a GPU, whether a change kept them.  It needs
NVVM (a CUDA toolkit's nvvm/, here /usr/local/cuda-13.0) and NVRTC (the wheel
nvidia-cuda-nvrtc, installed into a scratch folder, never the course's .venv):

    pip install --target /tmp/nvrtc13 "nvidia-cuda-nvrtc==13.0.*"
    git worktree add /tmp/before <commit>          # the code the records ran

    LD_LIBRARY_PATH=/tmp/nvrtc13/nvidia/cu13/lib CUDA_HOME=/usr/local/cuda-13.0 \
        PYTHONPATH=/tmp/before python benchmarks/ptx_compare.py dump /tmp/ptx_before
    LD_LIBRARY_PATH=... CUDA_HOME=... PYTHONPATH=. python benchmarks/ptx_compare.py dump /tmp/ptx_after
    python benchmarks/ptx_compare.py compare /tmp/ptx_before /tmp/ptx_after

``dump`` uses only these names of cuda_steps: ``plan(step, q, k, v, opts, mask, tiling=, splits=)``,
``SIMT_STEPS``, ``STEP_TILING``, ``Tiling``, ``DECODE_TILING`` and ``make_merge_kernel()``; of
``kernels.tensor_cores`` (and its ``backward``): ``plan``, ``words``, ``staged_tiling``, ``default_tiling``,
``decode_tiling``, ``shared_bytes``, ``MAX_SHARED`` and ``STATIC_SHARED`` (a checkout older than that package
names its modules in ``sys.modules`` first).
``compare`` renames every mangled symbol (_Z...) and shared array (_cudapy_smem_<n>) to S<n> in order of first appearance, drops
comments, blank lines and numba's environment pointers (``.common .global .u64 _ZN08NumbaEnv...``: one per Python
function compiled, which no instruction reads, so their count follows how the source is split into functions),
and diffs the instructions.
"""
import argparse
import difflib
import os
import re
import sys
from pathlib import Path

TUNED = {64: dict(Br=64, Bc=64, threads=128, tx=8, pad=4, prefetch=True, vec=True),
         128: dict(Br=128, Bc=64, threads=256, tx=16, pad=4, prefetch=True, vec=True)}


def off_the_gpu():
    """Let numba compile for sm_90 on a machine without a GPU: device functions are compiled for the
    current device's compute capability, and there is none here, so say 9.0."""
    from types import SimpleNamespace

    from numba.cuda import dispatcher
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))


def kernel_ptx(kernel, args):
    """The PTX for sm_90 of a numba CUDA kernel called with ``args``, compiled with the kernel's own fastmath."""
    import numba
    from numba import cuda
    sig = tuple(numba.typeof(a) for a in args)
    return cuda.compile_ptx(kernel.py_func, sig, fastmath=kernel.targetoptions.get("fastmath", False), cc=(9, 0))[0]


def dump(outdir, only=()):
    assert not os.environ.get("NUMBA_ENABLE_CUDASIM")
    import numpy as np
    off_the_gpu()
    from course_lib.core.options import call_forward
    from course_lib.kernels import cuda_steps as cs
    print("cuda_steps from", cs.__file__)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)

    def plan_for(step, D, Nq=64, Nk=64, tiling=None, splits=1):
        q = np.zeros((1, 2, Nq, D), np.float32)
        k = np.zeros((1, 2, Nk, D), np.float32)
        got = {}

        def grab(q, k, v, opts, mask):
            got["p"] = cs.plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
            return np.zeros(1), np.zeros(1)
        call_forward(grab, q, k, k.copy())
        return got["p"]

    def emit(name, kernel, args):
        ptx = kernel_ptx(kernel, args)
        (out / f"{name}.ptx").write_text(ptx)
        print(name, len(ptx.splitlines()), "lines", flush=True)

    def arrays(p, D, Nq, Nk, splits):
        q = np.zeros((1, 2, Nq, D), np.float32)
        k = np.zeros((1, 2, Nk, D), np.float32)
        if p.step in ("row", "row_exp2"):
            return (q, k, k, *p.args, np.zeros((1, 2, Nq, D), np.float32), np.zeros((1, 2, Nq), np.float32))
        return (q, k, k, *p.args, np.zeros((splits, 1, 2, Nq, D), np.float32),
                np.zeros((splits, 1, 2, Nq), np.float32))

    only = set(only)
    for D in (64, 128):
        for step in cs.SIMT_STEPS:
            name = f"{step}_D{D}"
            if only and name not in only:
                continue
            if step in ("row", "row_exp2"):
                tiling = None
            elif step == "tuned":
                tiling = cs.Tiling(**TUNED[D])
            else:
                tiling = cs.STEP_TILING[step]
            p = plan_for(step, D, tiling=tiling)
            emit(name, p.kernel, arrays(p, D, 64, 64, 1))
        name = f"decode_D{D}"
        if not only or name in only:
            p = plan_for("tuned", D, Nq=1, Nk=256, tiling=cs.DECODE_TILING, splits=4)
            emit(name, p.kernel, arrays(p, D, 1, 256, p.splits))
    if not only or "merge" in only:
        merge = cs.make_merge_kernel()
        emit("merge", merge, (np.zeros((4, 1, 2, 1, 64), np.float32), np.zeros((4, 1, 2, 1), np.float32),
                              np.zeros((1, 2, 1, 64), np.float32), np.zeros((1, 2, 1), np.float32)))
    dump_tensor_cores(out, only)


# (step, input dtype, kind) of every tensor-core kernel, and the head dims: 64 and 128 as timed, 40 for rows
# of fewer than 8 chunks (the swizzle's other branch, the unfolded ldmatrix addresses), as the checks ran
TC_STEPS = (("mma_f16", "float16", "f16"), ("mma_f16", "bfloat16", "bf16"), ("mma_tf32", "float32", "tf32x1"),
            ("mma_3xtf32", "float32", "tf32x3"))
TC_HEAD_DIMS = (40, 64, 128)


def tensor_core_tilings(tc, kind, D):
    """(label, tiling, query rows) of every forward version at head dim D: each load path of chapter 11's
    chain (one word at a time, register-staged with and without prefetch, ldmatrix, cp.async), the tuned
    tiling and the decode tiling."""
    from dataclasses import replace
    staged = tc.staged_tiling(kind, D, D)
    ld = replace(staged, prefetch=False, ldmatrix=True)
    found = [("plain", replace(staged, staged=False, prefetch=False), 64),
             ("staged", replace(staged, prefetch=False), 64), ("prefetch", replace(staged, prefetch=True), 64),
             ("ldmatrix", ld, 64), ("cp_async", replace(ld, stages=2), 64),
             ("tuned", tc.default_tiling(kind, D, D), 64), ("decode", tc.decode_tiling(kind, D, D), 1)]
    if kind == "tf32x3":      # 3xTF32's steps (e) and (f) on top of cp.async
        found += [("split_once", replace(ld, stages=2, split_once=True), 64),
                  ("q_shared", replace(ld, stages=2, split_once=True, q_shared=True), 64)]
    elif kind != "tf32x1":    # (f) for halves
        found.append(("q_shared", replace(ld, stages=2, q_shared=True), 64))
    seen, out = set(), []
    for label, tiling, Nq in found:
        if (tiling, Nq) not in seen and tc.shared_bytes(kind, tiling, D, D) <= (
                tc.MAX_SHARED if tiling.stages > 1 else tc.STATIC_SHARED):
            seen.add((tiling, Nq))
            out.append((label, tiling, Nq))
    return out


def dump_tensor_cores(out, only=()):
    """PTX of chapter 11's tensor-core forward (every kind, version and head dim above) and of chapter 12's
    two backward kernels (float16 and bfloat16, D = 64 / 128), named ``tc_<kind>_<version>_D<D>``."""
    import numpy as np

    from course_lib.core import rules
    from course_lib.core.backward_options import call_backward
    from course_lib.core.options import call_forward
    from course_lib.kernels import tensor_cores as tc
    from course_lib.kernels.tensor_cores import backward as tb
    print("tensor cores from", tc.__file__, flush=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def emit(name, kernel, args):
        ptx = kernel_ptx(kernel, args)
        (out / f"{name}.ptx").write_text(ptx)
        print(name, len(ptx.splitlines()), "lines", flush=True)

    dtypes = {"float16": np.float16, "bfloat16": rules.ml_dtypes.bfloat16, "float32": np.float32}
    for step, dtype, kind in TC_STEPS:
        for D in TC_HEAD_DIMS:
            for label, tiling, Nq in tensor_core_tilings(tc, kind, D):
                name = f"tc_{kind}_{label}_D{D}"
                if only and name not in only:
                    continue
                q, k = np.zeros((1, 2, Nq, D), dtypes[dtype]), np.zeros((1, 2, 256, D), dtypes[dtype])
                got = {}

                def grab(q, k, v, opts, mask):
                    got["p"] = tc.plan(step, q, k, v, opts, mask, tiling=tiling, splits=2)
                    return np.zeros(1), np.zeros(1)
                call_forward(grab, q, k, k.copy(), causal=True)
                p = got["p"]
                emit(name, p.kernel, (*(tc.words(x, kind) for x in (q, k, k)), *p.args,
                                      np.zeros((p.splits, 1, 2, Nq, D), np.float32),
                                      np.zeros((p.splits, 1, 2, Nq), np.float32)))
    for dtype, kind in (("float16", "f16"), ("bfloat16", "bf16")):
        for D in (64, 128):
            names = (f"tc_backward_{kind}_dkdv_D{D}", f"tc_backward_{kind}_dq_D{D}")
            if only and not set(names) & set(only):
                continue
            q, k = np.zeros((1, 2, 64, D), dtypes[dtype]), np.zeros((1, 1, 64, D), dtypes[dtype])
            o, lse = np.zeros((1, 2, 64, D), dtypes[dtype]), np.zeros((1, 2, 64), np.float32)
            got = {}

            def grab(q, k, v, out, lse, dout, opts, mask):
                got["p"] = tb.plan(q, k, v, opts, mask)
                return None, None, None
            call_backward(grab, q, k, k.copy(), o, lse, o)
            dkdv, dq, _, _, _, args_kv, args_q, kind_ = got["p"]
            ins = tuple(tc.words(x, kind_) for x in (q, k, k, o)) + (lse, lse)
            emit(names[0], dkdv, (*ins, *args_kv, np.zeros(k.shape, np.float32), np.zeros(k.shape, np.float32)))
            emit(names[1], dq, (*ins, *args_q, np.zeros(q.shape, np.float32)))


def normalise(text):
    names = {}

    def rename(m):
        return names.setdefault(m.group(0), f"S{len(names)}")
    lines = []
    for line in text.splitlines():
        line = line.split("//")[0].rstrip()
        if not line.strip() or line.startswith(".common .global") and "_ZN08NumbaEnv" in line:
            continue
        lines.append(re.sub(r"_Z[A-Za-z0-9_$]+|_cudapy_smem_[0-9]+", rename, line))
    return lines


def compare(before, after):
    before, after = Path(before), Path(after)
    total = 0
    print(f"{'kernel':22s} {'before':>7s} {'after':>7s} {'differ':>7s}")
    for path in sorted(before.glob("*.ptx")):
        other = after / path.name
        if not other.exists():
            print(f"{path.stem:22s} missing after")
            total += 1
            continue
        a, b = normalise(path.read_text()), normalise(other.read_text())
        differ = sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
                     if line[:1] in "+-" and not line.startswith(("+++", "---")))
        total += differ
        print(f"{path.stem:22s} {len(a):7d} {len(b):7d} {differ:7d}")
    print("all identical" if total == 0 else f"{total} differing lines")
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    dump_parser = commands.add_parser("dump", help="write every kernel's PTX into OUTDIR")
    dump_parser.add_argument("outdir")
    dump_parser.add_argument("kernels", nargs="*", help="only these (e.g. tuned_D64 decode_D128 merge)")
    diff = commands.add_parser("compare", help="diff two dumps; exit status 1 if any instruction differs")
    diff.add_argument("before")
    diff.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "dump":
        dump(args.outdir, args.kernels)
        return 0
    return 1 if compare(args.before, args.after) else 0


if __name__ == "__main__":
    sys.exit(main())
