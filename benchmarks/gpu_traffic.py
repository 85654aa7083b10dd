"""DRAM bytes read and written, from the GPU's own counters (ncu), beside iomodel's predictions.  (chapter 10)

    python benchmarks/gpu_traffic.py --out notebooks/records/gpu_traffic.jsonl

Runs itself under ``ncu --clock-control none --profile-from-start off`` once
per (impl, N, D): the child warms the impl up (compiles, allocates), then
profiles exactly one call between ``cudaProfilerStart`` / ``Stop``, so the
counters cover every kernel of that one call (naive torch is several: two
matmuls and a softmax) and nothing else.  ncu replays each kernel to collect
its metrics, so the times it reports are not timings; use gpu_steps.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from course_lib.bench import ncu

ROOT = Path(__file__).resolve().parent.parent

METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum"]
IMPLS = ["torch_naive", "torch_sdpa_efficient", "cuda_tuned"]


def child(impl, B, H, N, D, tuned):
    import gpu_steps as gs
    import torch
    import torch.cuda.profiler as profiler

    from course_lib import bench
    from course_lib.kernels import cuda_steps as cs
    torch.backends.cuda.matmul.allow_tf32 = False
    if tuned:
        for r in bench.load_records(tuned, benchmark="gpu_steps_tuned"):
            cs.TUNED[r["D"]] = cs.Tiling(**r["tiling"])
    pr = gs.Problem(B, H, N, N, D, seed=1)
    if impl == "cuda_tuned":
        p, fn = pr.call("tuned")
        extra = {"tiling": p.tiling.__dict__}
    else:
        fn = gs.peers(pr, False, [impl])[impl][0]
        extra = {}
    fn()
    fn()
    torch.cuda.synchronize()
    profiler.start()
    fn()
    torch.cuda.synchronize()
    profiler.stop()
    print("CHILD-EXTRA " + json.dumps(extra))


def parse(text):
    """Sum each metric over the kernels ncu profiled."""
    rows = ncu.kernel_rows(text, METRICS)
    total = {m: sum(r.get(m, 0.0) for r in rows) for m in METRICS}
    return total, [r["kernel"] for r in rows], {}


def predictions(B, H, N, D, tiling):
    from course_lib.models import iomodel
    out = {}
    try:
        br, bc = (tiling["Br"], tiling["Bc"]) if tiling else (64, 32)
        for schedule in ("naive", "fa2"):
            lv = iomodel.levels(N, N, D, dtype="float32", hw="h200", schedule=schedule, batch=B, heads=H,
                                block_q=br, block_k=bc)
            out[schedule] = {"two_level_bytes": lv.on_chip.bytes, "l2_aware_hbm_bytes": lv.hbm_bytes,
                             "compulsory_bytes": lv.compulsory_bytes, "kv_fits_l2": lv.kv_fits_l2,
                             "reason": lv.reason()}
    except Exception as error:  # noqa: BLE001
        out["error"] = f"{type(error).__name__}: {error}"
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "records" / "gpu_traffic.jsonl"))
    parser.add_argument("--child", nargs=5, default=None, metavar=("IMPL", "B", "H", "N", "D"))
    parser.add_argument("--shapes", nargs="+", default=["4,16,1024,64", "4,16,4096,64", "4,16,4096,128",
                                                       "1,16,16384,64"])
    parser.add_argument("--impls", nargs="+", default=IMPLS)
    parser.add_argument("--tuned", default=None)
    parser.add_argument("--ncu", default="ncu")
    args = parser.parse_args(argv)
    if args.child:
        impl, B, H, N, D = args.child
        child(impl, int(B), int(H), int(N), int(D), args.tuned)
        return
    from course_lib import bench
    env = bench.environment()
    run = bench.new_run()
    with bench.RecordFile(args.out) as out:
        for shape in args.shapes:
            B, H, N, D = (int(x) for x in shape.split(","))
            for impl in args.impls:
                cmd = ncu.command(args.ncu, METRICS, __file__, ["--child", impl, str(B), str(H), str(N), str(D)],
                                  args.tuned)
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)
                    total, kernels, _ = parse(r.stdout)
                    extra = {}
                    for line in r.stdout.splitlines():
                        if line.startswith("CHILD-EXTRA "):
                            extra = json.loads(line[len("CHILD-EXTRA "):])
                    rec = {"benchmark": "gpu_traffic", "run_id": run, "run": run, "impl": impl,
                           "B": B, "H": H, "Nq": N, "Nk": N, "D": D, "dtype": "float32", "causal": False,
                           "dram_bytes_read": total["dram__bytes_read.sum"],
                           "dram_bytes_write": total["dram__bytes_write.sum"],
                           "l2_bytes": total["lts__t_bytes.sum"], "kernels": kernels,
                           "ncu": "ncu --clock-control none, one call, counters summed over its kernels",
                           "predictions": predictions(B, H, N, D, extra.get("tiling")), **extra,
                           "returncode": r.returncode, "environment": env}
                    if not kernels:
                        rec["stderr_tail"] = (r.stderr or "")[-1500:]
                        rec["stdout_tail"] = (r.stdout or "")[-1500:]
                except Exception as error:  # noqa: BLE001
                    rec = {"benchmark": "gpu_traffic", "run_id": run, "impl": impl, "B": B, "H": H, "Nq": N,
                           "D": D, "error": f"{type(error).__name__}: {error}", "environment": env}
                out.write(rec)
                print(f"traffic {impl:22s} B={B} H={H} N={N} D={D}: read {rec.get('dram_bytes_read', 0) / 1e6:10.1f} MB "
                      f"write {rec.get('dram_bytes_write', 0) / 1e6:10.1f} MB  kernels {len(rec.get('kernels', []))} "
                      f"{rec.get('error', '')}{rec.get('stderr_tail', '')[-300:]}", flush=True)


if __name__ == "__main__":
    main()
