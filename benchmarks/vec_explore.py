"""Exploration on the GPU (not the committed record run): tiled_vec4's candidates, causal, decode.

    python benchmarks/vec_explore.py OUTDIR [parts...]
"""
import argparse
import json
import time
import traceback
from pathlib import Path

import gpu_steps as gs

from course_lib import bench
from course_lib.core.flops import attention_flops
from course_lib.kernels import cuda_steps as cs

LOG = None     # explore.jsonl: every timing of the exploration


def rec(**kw):
    print(json.dumps(LOG.write(kw), default=str), flush=True)


def T(Br, Bc, th, tx, pf=True, cap=0):
    return cs.Tiling(Br=Br, Bc=Bc, threads=th, tx=tx, pad=4, prefetch=pf, max_regs=cap, vec=True)


def time_one(pr, label, tiling=None, splits=1, step="tuned", causal=False, repeats=10):
    import torch
    try:
        t0 = time.time()
        p, call = pr.call(step, tiling=tiling, splits=splits, causal=causal)
        call()
        torch.cuda.synchronize()
        comp = time.time() - t0
        acc = gs.accuracy(pr, causal)
        t, ts = gs.cuda_timer(call, repeats)
        B, H, Nq, Nk, D = pr.shape
        flops = attention_flops(B, H, Nq, Nk, D, causal=causal)
        ex = gs.step_extra(p)
        rec(label=label, shape=pr.shape, causal=causal, splits=p.splits, ms=t * 1e3, tflops=flops / t / 1e12,
            ok=acc["ok"], err=acc["max_abs_err"], compile_s=round(comp, 1), regs=ex["resources"],
            occ=ex.get("occupancy"), tiling=ex.get("tiling"), grid=p.griddim)
        return t
    except Exception as error:  # noqa: BLE001
        rec(label=label, error=f"{type(error).__name__}: {str(error)[:400]}", tb=traceback.format_exc()[-800:])
        return None


def part_check():
    steps = cs.SIMT_STEPS
    cs.SIMT_STEPS = ("tiled_vec4", "tuned")
    try:
        gs.part_check(None)
    finally:
        cs.SIMT_STEPS = steps


CANDS = {
    64: [(64, 64, 128, 8, True, 0), (128, 64, 256, 16, True, 0), (128, 64, 256, 8, True, 0)],
    128: [(128, 64, 256, 16, True, 0), (128, 32, 256, 16, True, 0), (128, 64, 256, 16, True, 0)],
}
BEST = {}


def part_cands():
    import torch
    for D in (64, 128):
        pr = gs.Problem(4, 16, 4096, 4096, D, seed=D)
        t = gs.cuda_timer(lambda: gs.naive_torch(pr.q, pr.k, pr.v, False), 10)[0]
        rec(label="torch_naive", D=D, ms=t * 1e3, tflops=attention_flops(4, 16, 4096, 4096, D) / t / 1e12)
        times = []
        for c in CANDS[D]:
            times.append((time_one(pr, f"vec{c}", tiling=T(*c)) or 1e9, c))
        BEST[D] = T(*min(times)[1])
        pr = None  # free the GPU arrays before the next size
        torch.cuda.empty_cache()


def part_causal():
    import torch
    best = {64: BEST.get(64, T(64, 64, 256, 16, True, 128)), 128: BEST.get(128, T(64, 32, 256, 16, True, 128))}
    for D in (64, 128):
        for causal in (False, True):
            pr = gs.Problem(2, 16, 8192, 8192, D, seed=D)
            time_one(pr, f"causal8192 {best[D]}", tiling=best[D], causal=causal)
            pr = None  # free the GPU arrays before the next size
            torch.cuda.empty_cache()


def part_decode():
    import torch
    for D in (64, 128):
        pr = gs.Problem(8, 16, 1, 32768, D, seed=7)
        for Bc in (32,):
            for th, tx in ((32, 32),):
                til = cs.Tiling(Br=1, Bc=Bc, threads=th, tx=tx, pad=4, prefetch=False, vec=True)
                for splits in (1, 8, 16, 32, 64):
                    time_one(pr, f"decode Bc={Bc} th={th}", tiling=til, splits=splits)
        pr = None  # free the GPU arrays before the next size
        torch.cuda.empty_cache()


def main(argv=None):
    global LOG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path, help="where explore.jsonl and check.jsonl are appended to")
    parser.add_argument("parts", nargs="*", default=["check", "cands", "causal", "decode"])
    args = parser.parse_args(argv)
    gs.RUN, gs.ENV = "explore", {}
    with bench.RecordFile(args.outdir / "explore.jsonl") as LOG, bench.RecordFile(args.outdir / "check.jsonl") as gs.OUT:
        for part in args.parts:
            t0 = time.time()
            try:
                globals()[f"part_{part}"]()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            print(f"== {part} {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
