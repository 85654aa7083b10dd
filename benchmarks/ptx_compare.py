"""PTX for sm_90 of every chapter-10 kernel the H200 records ran, compiled off the GPU.

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
``SIMT_STEPS``, ``STEP_TILING``, ``Tiling``, ``DECODE_TILING`` and ``make_merge_kernel()``.
``compare`` renames every mangled symbol (_Z...) and shared array (_cudapy_smem_<n>) to S<n> in order of first appearance, drops
comments, blank lines and numba's environment declarations (``.common .global ... _ZN08NumbaEnv...``, one per
Python function compiled in, used by no instruction), and diffs the instructions.
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
