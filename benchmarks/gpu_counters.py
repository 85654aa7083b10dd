"""What each chapter-10 step makes the GPU do, from its own counters (ncu).  (chapter 10)

    python benchmarks/gpu_counters.py --tuned notebooks/records/gpu_steps.jsonl \\
        --out notebooks/records/gpu_counters.jsonl

Chapter 10 explains its steps' gains by what holds each one back: shared-memory
loads, bank conflicts, latency, occupancy.  This measures those, so the
explanations rest on counters, not on the model alone.  One child process runs
every step once at each shape under ``ncu --clock-control none --profile-from-start
off``: it compiles and warms each step up first, then profiles exactly one call per
step between ``cudaProfilerStart`` / ``Stop``, so the n-th profiled kernel is the
n-th step (each step is one kernel at ``splits=1``).  Per step and shape it records

- shared-memory load instructions and wavefronts (the transactions they became),
  bank conflicts, and FMAs executed, so shared loads per FMA are measured;
- achieved occupancy (active warps over the SM's maximum) and the theoretical one;
- registers per thread and local-memory (spill) traffic;
- warp stall reasons: the average number of warps stalled for each reason per
  issued instruction (ncu's ``smsp__average_warps_issue_stalled_*_per_issue_active``).

``--mma`` profiles chapter 11's tensor-core kernels instead (``gpu_counters_mma``): each step of its
chain (register-staged, ``ldmatrix``, ``cp.async``) and the tuned tiling, fp16 and 3xTF32, with the
tensor pipe's active cycles and the ldmatrix / cp.async (LDGSTS) instructions and their conflicts added
(``ldsm_conflicts``: ncu's ldsm count, or all shared conflicts less the plain loads' and stores'):

    python benchmarks/gpu_counters.py --mma --out notebooks/records/gpu_counters_mma.jsonl

Metrics this ncu does not know are left out (and listed in the record), so one
renamed counter does not lose the run.  ncu replays each kernel to collect its
metrics, so its durations are not timings; gpu_steps.py's are.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

STALLS = ["long_scoreboard", "short_scoreboard", "mio_throttle", "barrier", "math_pipe_throttle", "wait",
          "not_selected", "selected", "lg_throttle", "dispatch_stall", "no_instruction", "drain", "membar",
          "branch_resolving", "sleeping", "tex_throttle", "imc_miss", "misc"]
METRICS = (["smsp__inst_executed_op_shared_ld.sum",
            "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
            "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
            "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
            "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
            "smsp__inst_executed.sum",
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            "sm__maximum_warps_per_active_cycle_pct",
            "launch__registers_per_thread",
            "launch__occupancy_limit_registers",
            "launch__occupancy_limit_shared_mem",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__time_duration.sum"]
           + [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS])
TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
LDSM_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum"
# Every shared-memory access's wavefronts and conflicts, whatever its instruction: where an ncu has no
# ldsm breakdown (the H100's of run 20261206T080617 had none), ldmatrix's share is these less op_ld's and op_st's.
SHARED_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
MMA_METRICS = METRICS + [TENSOR_PIPE, "smsp__inst_executed_pipe_tensor_op_hmma.sum", "smsp__inst_executed_op_ldsm.sum",
                         "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum", LDSM_CONFLICTS,
                         "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", SHARED_CONFLICTS,
                         "smsp__inst_executed_op_ldgsts.sum"]
MMA_KINDS = (("mma_f16", "float16"), ("mma_3xtf32", "float32"))


def ldsm_conflicts(counters):
    """ldmatrix's bank conflicts: ncu's own count where it has one, else all shared conflicts less the plain
    loads' and stores' (NaN where neither was measured)."""
    if LDSM_CONFLICTS in counters:
        return counters[LDSM_CONFLICTS]
    parts = [SHARED_CONFLICTS, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
             "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"]
    if not all(p in counters for p in parts):
        return float("nan")
    return counters[parts[0]] - counters[parts[1]] - counters[parts[2]]


def mma_tilings(kind, D):
    """(label, tiling) profiled at head dim D: chapter 11's chain, then the tuned tiling if it is another."""
    import gpu_mma

    from course_lib.kernels import tensor_cores as tc
    steps = gpu_mma.chain(kind, D)
    tuned = tc.default_tiling(kind, D, D)
    return steps + ([("tuned", tuned)] if all(t != tuned for _, t in steps) else [])


def profile(calls):
    """Each (info, fn) of ``calls`` (compiled and warmed up) run once between profiler start / stop, so that the
    n-th kernel ncu profiles is the n-th call; then the calls' order, for the parent to match them up."""
    import torch
    import torch.cuda.profiler as profiler
    torch.cuda.synchronize()
    for _info, fn in calls:
        profiler.start()
        fn()
        torch.cuda.synchronize()
        profiler.stop()
    print("CHILD-ORDER " + json.dumps([info for info, _ in calls], default=str))


def mma_child(shapes):
    """One profiled call of every (step, tiling, shape), after a compile and a warm-up."""
    import gpu_mma

    from course_lib.kernels import tensor_cores as tc
    calls = []
    for B, H, N, D in shapes:
        q, k, v = gpu_mma.problem(B, H, H, N, N, D, D, "float32", seed=1)
        for step, dtype in MMA_KINDS:
            x = tuple(a.astype(np.float16) if dtype == "float16" else a for a in (q, k, v))
            for label, tiling in mma_tilings(tc.kind_of(step, x[0].dtype), D):
                fn = gpu_mma.mma_call(step, *x, tiling=tiling)[0]
                fn()
                fn()
                calls.append(({"step": step, "chain_step": label, "dtype": dtype, "B": B, "H": H, "N": N, "D": D,
                               "tiling": gpu_mma.tdict_of(tiling)}, fn))
    profile(calls)


def child(shapes, steps, tuned):
    import gpu_steps as gs

    from course_lib import bench
    from course_lib.kernels import cuda_steps as cs
    if tuned:
        for r in bench.load_records(tuned, benchmark="gpu_steps_tuned"):
            cs.TUNED[r["D"]] = cs.Tiling(**r["tiling"])
    calls = []
    for B, H, N, D in shapes:
        pr = gs.Problem(B, H, N, N, D, seed=1)
        for step in steps:
            p, fn = pr.call(step)
            fn()
            fn()
            calls.append(({"step": step, "B": B, "H": H, "N": N, "D": D, **gs.step_extra(p)}, fn))
    profile(calls)


def known_metrics(ncu, wanted=METRICS):
    """The metrics of ``wanted`` this ncu can collect (by base name, as --query-metrics lists them)."""
    listed = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return [m for m in wanted if m.split(".")[0] in names]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "records" / "gpu_counters.jsonl"))
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--shapes", nargs="+", default=["4,16,4096,64", "4,16,4096,128"])
    parser.add_argument("--steps", nargs="+", default=None)
    parser.add_argument("--tuned", default=None)
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--mma", action="store_true", help="chapter 11's tensor-core kernels, not chapter 10's steps")
    args = parser.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    from course_lib.kernels import cuda_steps as cs
    steps = args.steps or list(cs.SIMT_STEPS)
    if args.child:
        mma_child(shapes) if args.mma else child(shapes, steps, args.tuned)
        return
    from course_lib import bench
    from course_lib.bench import ncu
    wanted = MMA_METRICS if args.mma else METRICS
    metrics = known_metrics(args.ncu, wanted)
    missing = [m for m in wanted if m not in metrics]
    child_args = ["--child", "--mma", "--shapes", *args.shapes] if args.mma else \
        ["--child", "--shapes", *args.shapes, "--steps", *steps]
    cmd = ncu.command(args.ncu, metrics, __file__, child_args, None if args.mma else args.tuned)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=560, env=os.environ)
    order = next((json.loads(line[len("CHILD-ORDER "):]) for line in r.stdout.splitlines()
                  if line.startswith("CHILD-ORDER ")), [])
    rows = ncu.kernel_rows(r.stdout, metrics)
    env, run = bench.environment(), bench.new_run()
    if len(rows) != len(order):
        print(f"expected {len(order)} profiled kernels, got {len(rows)}; rc={r.returncode}\n"
              f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}", flush=True)
        return 1
    with bench.RecordFile(args.out) as out:
        for info, row in zip(order, rows):
            counters = {m: v for m, v in row.items() if m != "kernel"}
            rec = {"benchmark": "gpu_counters_mma" if args.mma else "gpu_counters", "run_id": run, "run": run,
                   "impl": f"cuda_{info['step']}", "Nq": info["N"], "Nk": info["N"], "dtype": "float32",
                   "causal": False, "kernel": row["kernel"],
                   "counters": counters, "metrics_unknown_to_ncu": missing,
                   "ncu": "ncu --clock-control none, one call per step, counters of its one kernel",
                   **info, "environment": env}
            out.write(rec)
            top = sorted(((v, m) for m, v in counters.items() if "stalled" in m), reverse=True)[:2]
            stalls = [(m.split("stalled_")[1].split("_per")[0], round(v, 2)) for v, m in top]
            if args.mma:
                print(f"{info['step']:11s} {info['chain_step']:9s} D={info['D']:3d} "
                      f"tensor pipe {counters.get(TENSOR_PIPE, float('nan')):5.1f}% "
                      f"ldsm conflicts {ldsm_conflicts(counters):10.0f} "
                      f"regs {counters.get('launch__registers_per_thread', 0):4.0f} "
                      f"occ {counters.get('sm__warps_active.avg.pct_of_peak_sustained_active', 0):5.1f}% "
                      f"stalls {stalls}", flush=True)
                continue
            fma = counters.get("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum") or float("nan")
            ld = counters.get("smsp__inst_executed_op_shared_ld.sum", float("nan"))
            print(f"{info['step']:15s} D={info['D']:3d} shared ld/FMA(thread) {32 * ld / fma:6.3f} "
                  f"conflicts {counters.get('l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum', 0):12.0f} "
                  f"occ {counters.get('sm__warps_active.avg.pct_of_peak_sustained_active', 0):5.1f}% "
                  f"stalls {stalls}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
