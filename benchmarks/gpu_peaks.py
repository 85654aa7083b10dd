"""The GPU figures chapter 02 argues from, measured and recorded: the ceilings and the peers at its shape.

    python benchmarks/gpu_peaks.py --out notebooks/records/gpu_peaks.jsonl          # ceilings and peers
    python benchmarks/gpu_peaks.py --ncu --out notebooks/records/gpu_peaks.jsonl    # + DRAM / L2 bytes (ncu)

Chapter 02 places attention on the roofline of a real GPU with a measured copy bandwidth
(a device-to-device copy, bytes read + written), a measured fp32 ceiling (cuBLAS sgemm with
TF32 off: the SIMT FMA rate in practice), and the speeds of PyTorch's SDPA backends (cuDNN,
FlashAttention-2, efficient) at the shape the chapter plots: fp16, B = 2, H = 16, N = 8192,
D = 128, not causal.  Chapter 03 argues from the DRAM and L2 bytes that ncu counts for
FlashAttention-2's kernel at B = 2, H = 16, D = 128, fp16, N = 4096 and 16384.  Each figure
is one record naming the card; ratios are only ever taken within one run.

Times are CUDA events around the call after warm-up (the kernel layer), the median of
``--repeats``.  With ``--ncu`` the script re-runs itself under
``ncu --clock-control none --profile-from-start off`` once per N: the child warms the kernel
up, then profiles exactly one call between ``cudaProfilerStart`` / ``Stop``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess

from course_lib import bench
from course_lib.bench import ncu, peers

SHAPE = dict(B=2, H=16, N=8192, D=128)            # chapter 02's plotted shape
NCU_SEQLENS = (4096, 16384)                        # chapter 03's ncu shapes (B = 2, H = 16, D = 128)
NCU_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"]
PEERS = ("torch_sdpa_cudnn", "torch_sdpa_flash", "torch_sdpa_efficient")   # bench.peers' SDPA backends


def sdpa_call(impl, N, B=SHAPE["B"], H=SHAPE["H"], D=SHAPE["D"]):
    """Peer ``impl`` (``bench.peers.torch_calls``) on fp16 inputs of chapter 02's shape, non-causal."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    return peers.torch_calls(q, k, v, causal=False)[impl]


def ceilings(repeats):
    """(name, value, unit, detail) of the copy bandwidth and the fp32 sgemm ceiling."""
    import torch
    out = []
    n = 1 << 28                                      # 1 GiB of float32 each way
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t, times = bench.cuda_time_it(lambda: dst.copy_(src), repeats)
    out.append(("copy_bandwidth", 2 * src.numel() * 4 / t, "B/s",
                dict(bytes=2 * src.numel() * 4, median_s=t, min_ms=min(times), max_ms=max(times),
                     how="device-to-device copy of 1 GiB, bytes read + written")))
    src = dst = None                                 # free the 2 GiB before the matmul
    torch.backends.cuda.matmul.allow_tf32 = False
    m = 8192
    a, b = torch.randn(m, m, device="cuda"), torch.randn(m, m, device="cuda")
    t, times = bench.cuda_time_it(lambda: a @ b, repeats)
    out.append(("sgemm_fp32", 2 * m ** 3 / t, "FLOP/s",
                dict(m=m, median_s=t, min_ms=min(times), max_ms=max(times),
                     how="cuBLAS fp32 matmul 8192^3, TF32 off (torch.backends.cuda.matmul.allow_tf32 = False)")))
    return out


def measure(out, repeats):
    import torch
    env, run = bench.gpu_environment(), bench.new_run()
    rows = []
    with bench.RecordFile(out, benchmark="gpu_peaks", run=run, run_id=run, device=env["gpu"]) as f:
        for name, value, unit, detail in ceilings(repeats):
            f.write(dict(kind="ceiling", measure=name, value=value, unit=unit, **detail, environment=env))
            rows.append(f"{name:22s} {value / 1e12:8.2f} T{unit}")
    B, H, N, D = SHAPE["B"], SHAPE["H"], SHAPE["N"], SHAPE["D"]
    for impl in PEERS:
        try:
            call = sdpa_call(impl, N)
            t, times = bench.cuda_time_it(call, repeats)
        except RuntimeError as error:              # a backend this build or card does not offer
            rows.append(f"{impl:22s} unavailable: {str(error).splitlines()[0][:80]}")
            continue
        rec = bench.append_record(out, benchmark="gpu_peaks", impl=impl, shape=(B, H, N, N, D), dtype="float16",
                                  time_s=t, run=run, env=env, layer="kernel", device=env["gpu"],
                                  runs_on=peers.peer_runs_on(impl, "float16"), repeats=repeats,
                                  min_ms=min(times), max_ms=max(times))
        rows.append(f"{impl:22s} {rec['tflops']:8.1f} TFLOP/s  ({t * 1e3:.3f} ms)")
        torch.cuda.empty_cache()
    print(f"run {run} on {env['gpu']}")
    print("\n".join(rows))
    return run, env


def child(impl, N):
    import torch
    import torch.cuda.profiler as profiler
    call = sdpa_call(impl, N)
    call()
    call()
    torch.cuda.synchronize()
    profiler.start()
    call()
    torch.cuda.synchronize()
    profiler.stop()


def profile(out, run, env, impl="torch_sdpa_flash"):
    ncu_path = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    B, H, D = SHAPE["B"], SHAPE["H"], SHAPE["D"]
    with bench.RecordFile(out, benchmark="gpu_peaks", run=run, run_id=run, device=env["gpu"]) as f:
        for N in NCU_SEQLENS:
            done = subprocess.run(ncu.command(ncu_path, NCU_METRICS, __file__, ["--child", impl, str(N)]),
                                  capture_output=True, text=True, timeout=600, env=dict(os.environ))
            rows = ncu.kernel_rows(done.stdout, NCU_METRICS)
            if not rows:
                print(f"ncu N={N}: no kernel rows (rc {done.returncode})\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
                continue
            dram = sum(r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"] for r in rows)
            l2 = sum(r["lts__t_bytes.sum"] for r in rows)
            f.write(dict(kind="ncu", impl=impl, runs_on=peers.peer_runs_on(impl, "float16"), dtype="float16",
                         B=B, H=H, Nq=N, Nk=N, D=D,
                         causal=False, dram_bytes=dram, l2_bytes=l2, kernels=rows,
                         how="ncu --clock-control none --profile-from-start off, one call after warm-up",
                         environment=env))
            print(f"ncu {impl} N={N}: DRAM {dram / 1e6:.0f} MB, L2 {l2 / 1e9:.2f} GB over {len(rows)} kernel(s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="notebooks/records/gpu_peaks.jsonl")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ncu", action="store_true", help="also count FlashAttention-2's DRAM / L2 bytes with ncu")
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], int(args.child[1]))
    run, env = measure(args.out, args.repeats)
    if args.ncu:
        profile(args.out, run, env)


if __name__ == "__main__":
    main()
