"""Registers, spills and shared memory of chapter 11's and 12's tensor-core kernels, from ptxas, off the GPU.

ncu on the H100 of run 20261206T080617 could not read ``launch__registers_per_thread``, so chapter 11's
counters table has each step's local-memory traffic but not its registers.  This compiles each kernel to
PTX for sm_90 without a GPU (numba's ``compile_ptx``; the ``mma.sync`` / ``ldmatrix`` / ``cp.async`` are
inline assembly, so the PTX is the whole kernel) and asks ptxas for its resources (``ptxas -v``):

    pip install --target /tmp/nvrtc13 "nvidia-cuda-nvrtc==13.*"
    LD_LIBRARY_PATH=/tmp/nvrtc13/nvidia/cu13/lib CUDA_HOME=/usr/local/cuda-13.0 PYTHONPATH=. \\
        python benchmarks/ptxas_resources.py --out notebooks/records/ptxas_resources.jsonl

On a GPU the driver compiles the same PTX with its own ptxas, which need not agree to the register: each
backward record carries the counts the H100's driver gave the same kernels (run 20261206T074510, numba's
``get_regs_per_thread``) beside this ptxas's, so the table says how far to trust the forward's.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GPU_RUN = "20261206T074510+0000"     # chapter 12's tensor-core backward on an H100, with its kernels' resources


def ptxas(ptx, ptxas_bin, path):
    """ptxas -v's resources of the one kernel in ``ptx``."""
    path.write_text(ptx)
    r = subprocess.run([ptxas_bin, "-v", "-arch=sm_90", str(path), "-o", "/dev/null"], capture_output=True,
                       text=True, check=True)
    text = r.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else 0
    # shared_bytes: the static shared memory ptxas sees; cp.async's stages are dynamic, sized at launch
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "stack_frame": number(r"(\d+) bytes stack frame"),
            "shared_bytes": number(r"(\d+) bytes smem")}


def forward_kernels():
    """(record fields, kernel, arguments) of every step of chapter 11's chain and its tuned tiling."""
    import gpu_mma
    from gpu_counters import MMA_KINDS, mma_tilings

    from course_lib.core.options import call_forward
    from course_lib.kernels import tensor_cores as tc
    from course_lib.kernels.tensor_cores.layout import words
    for step, dtype in MMA_KINDS:       # the kernels chapter 11's counters profiled
        kind = tc.kind_of(step, dtype)
        for D in (64, 128):
            tuned = tc.default_tiling(kind, D, D)
            for label, tiling in mma_tilings(kind, D):
                q, k = np.zeros((1, 2, 64, D), dtype), np.zeros((1, 2, 64, D), dtype)
                got = {}

                def grab(q, k, v, opts, mask):
                    got["p"] = tc.plan(step, q, k, v, opts, mask, tiling=tiling)
                    return np.zeros(1), np.zeros(1)
                call_forward(grab, q, k, k.copy())
                p = got["p"]
                args = (*(words(x, kind) for x in (q, k, k)), *p.args,
                        np.zeros((1, 1, 2, 64, D), np.float32), np.zeros((1, 1, 2, 64), np.float32))
                dynamic = tc.shared_bytes(kind, tiling, D, D) if tiling.stages > 1 else 0    # cp.async's stages
                yield ({"chapter": 11, "step": step, "chain_step": label, "is_tuned": tiling == tuned,
                        "kernel": "forward", "D": D, "tiling": gpu_mma.tdict_of(tiling),
                        "dynamic_shared_bytes": dynamic}, p.kernel, args)


def backward_kernels():
    """(record fields, kernel, arguments) of chapter 12's two tensor-core backward kernels, fp16, D = 64 / 128."""
    from course_lib.core.backward_options import call_backward
    from course_lib.kernels.tensor_cores import backward as tb
    from course_lib.kernels.tensor_cores.layout import words
    gpu = {}
    for line in (ROOT / "notebooks" / "records" / "gpu_backward.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("run") == GPU_RUN and r.get("impl") == "cuda_mma_f16" and r.get("resources"):
            gpu[r["D"]] = r["resources"]
    for D in (64, 128):
        q, k = np.zeros((1, 2, 64, D), np.float16), np.zeros((1, 1, 64, D), np.float16)
        out, lse = np.zeros((1, 2, 64, D), np.float16), np.zeros((1, 2, 64), np.float32)
        got = {}

        def grab(q, k, v, out, lse, dout, opts, mask):
            got["p"] = tb.plan(q, k, v, opts, mask)
            return None, None, None
        call_backward(grab, q, k, k.copy(), out, lse, out)
        dkdv, dq, _, _, _, args_kv, args_q, kind = got["p"]
        ins = tuple(words(x, kind) for x in (q, k, k, out)) + (lse, lse)
        for name, kernel, args, outs in (("dkdv", dkdv, args_kv, (np.zeros(k.shape, np.float32),) * 2),
                                         ("dq", dq, args_q, (np.zeros(q.shape, np.float32),))):
            yield ({"chapter": 12, "step": "cuda_mma_f16 backward", "kernel": name, "D": D,
                    "gpu_driver": {"run": GPU_RUN, **gpu[D][name]} if D in gpu else None},
                   kernel, (*ins, *args, *outs))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "records" / "ptxas_resources.jsonl"))
    parser.add_argument("--ptxas", default="/usr/local/cuda-13.0/bin/ptxas")
    args = parser.parse_args(argv)
    from ptx_compare import kernel_ptx, off_the_gpu
    off_the_gpu()
    from course_lib import bench
    version = subprocess.run([args.ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    run, env = bench.new_run(), bench.environment()
    scratch = Path("/tmp/ptxas_resources")
    scratch.mkdir(exist_ok=True)
    with bench.RecordFile(args.out) as out:
        for fields, kernel, kargs in (*forward_kernels(), *backward_kernels()):
            res = ptxas(kernel_ptx(kernel, kargs), args.ptxas, scratch / "kernel.ptx")
            rec = {"benchmark": "ptxas_resources", "run": run, "run_id": run, **fields, **res,
                   "tool": f"ptxas -v -arch=sm_90, off the GPU ({version})", "environment": env}
            out.write(rec)
            print(f"{fields['step']:>22} {fields.get('chain_step', fields['kernel']):>18} D={fields['D']:3d}: "
                  f"{res['registers']} registers, spill {res['spill_stores']} / {res['spill_loads']} B, "
                  f"stack {res['stack_frame']} B, smem {res['shared_bytes']} B"
                  + (f"   (H100 driver: {fields['gpu_driver']['registers']} registers, "
                     f"{fields['gpu_driver']['local_bytes']} B local)" if fields.get("gpu_driver") else ""),
                  flush=True)
    print(f"records appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
