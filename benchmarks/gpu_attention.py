"""flash_numba_cuda on a GPU, beside naive torch fp32 and PyTorch SDPA (efficient, fp32).  (chapter 09)

    python benchmarks/gpu_attention.py --out notebooks/records/gpu_attention.jsonl

Needs a CUDA GPU, numba-cuda and torch (a benchmark, not a test: nothing here
asserts a speed).  Four parts, all appending to one JSON-lines file, each
record tagged with ``benchmark``:

- ``gpu_attention_check``: the kernel through ``course_lib.attention`` against
  the float64 reference on awkward small shapes (tails, Nq != Nk, GQA, every
  mask kind, softcap, ALiBi), with the course's float32 rule;
- ``gpu_attention_large``: at N up to 16K, D 64 and 128, causal or not, the
  kernel's output and lse against a float64 SDPA on the GPU (for two heads of
  the first batch, to bound memory), beside naive torch fp32's error;
- ``gpu_attention``: time of the kernel and of the two peers on the same
  inputs, in the same run: H = 16, B = 16384 / N (as GPU.md's table),
  CUDA events around each launch, the median of ``--repeats`` after warm-up;
  inputs stay on the device (``cuda.as_cuda_array`` of torch tensors is
  zero-copy), so this is the kernel's time, not the host copies';
- ``gpu_attention_blocks``: the kernel at one shape for several (Br, Bc).

TF32 is off for the torch peers (``allow_tf32 = False``): the kernel and naive
torch's cuBLAS matmuls compute in float32 on the SIMT cores.  SDPA's
memory-efficient kernel does not read that switch: its CUTLASS kernel computes
each fp32 matmul on the tensor cores as three TF32 products (3xTF32).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from course_lib import api, bench, checks
from course_lib.core.options import call_forward
from course_lib.kernels import flash_numba_cuda as fnc

ROOT = Path(__file__).resolve().parent.parent


def plan_for(q, k, v, **options):
    """flash_numba_cuda's Plan for a call, validated as ``course_lib.attention`` validates it."""
    got = {}

    def grab(q, k, v, opts, mask):
        got["plan"] = fnc.plan(q, k, v, opts, mask)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v, **options)
    return got["plan"]


cuda_timer = bench.cuda_time_it    # the kernel layer: CUDA events around each call


def kernel_call(p, tq, tk, tv, tout, tlse):
    from numba import cuda
    args = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args]
    dq, dk, dv, dout, dlse = (cuda.as_cuda_array(t) for t in (tq, tk, tv, tout, tlse))
    launch = p.kernel[p.griddim, p.blockdim]
    return lambda: launch(dq, dk, dv, *args, dout, dlse)


def resources(p):
    k = p.kernel
    out = {}
    for name in ("get_regs_per_thread", "get_shared_mem_per_block", "get_local_mem_per_thread"):
        try:
            value = getattr(k, name)()  # a dict by signature for a kernel compiled lazily
            values = sorted({int(x) for x in value.values()}) if isinstance(value, dict) else [int(value)]
            out[name[4:]] = values[0] if len(values) == 1 else values
        except Exception as error:  # noqa: BLE001
            out[name[4:]] = f"{type(error).__name__}: {error}"
    return out


def part_check(out, run, env):
    rng = np.random.default_rng(0)
    cases = [
        dict(shape=(2, 4, 2, 203, 333, 64, 64), opts=dict(causal=True)),
        dict(shape=(1, 4, 1, 333, 203, 64, 32), opts=dict(causal=True, causal_align="top_left")),
        dict(shape=(2, 2, 2, 257, 257, 128, 128), opts=dict(window_size=(40, 7))),
        dict(shape=(1, 3, 3, 100, 517, 96, 96), opts=dict(softcap=30.0, alibi_slopes=np.array([0.5, 0.1, 0.02]))),
        dict(shape=(1, 2, 1, 77, 50, 256, 256), opts=dict(causal=True, window_size=(-1, -1))),
        dict(shape=(1, 2, 2, 64, 1000, 40, 24), opts=dict(window_size=(3, 3), block_q=128, block_k=16)),
    ]
    for c in cases:
        B, H, Hk, Nq, Nk, D, Dv = c["shape"]
        q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
        k = rng.standard_normal((B, Hk, Nk, D)).astype(np.float32)
        v = rng.standard_normal((B, Hk, Nk, Dv)).astype(np.float32)
        try:
            o, lse = api.attention(q, k, v, impl="flash_numba_cuda", return_lse=True, **c["opts"])
            checks.check_attention(o, q, k, v, lse=lse, **c["opts"])
            verdict = "PASS"
        except Exception as error:  # noqa: BLE001 -- recorded, and the run goes on
            verdict = f"FAIL {type(error).__name__}: {str(error)[:2000]}"
            bench.log(traceback.format_exc())
        bench.log("check", c["shape"], {k: v for k, v in c["opts"].items() if k != "alibi_slopes"}, verdict[:300])
        opts = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in c["opts"].items()}
        out.write({"benchmark": "gpu_attention_check", "run": run, "shape": c["shape"],
                   "options": opts, "verdict": verdict, "environment": env})


def part_large(args, out, run, env, timing):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    H = args.heads
    for n in args.sizes:
        B = max(1, args.tokens // n)
        for d in args.head_dims:
            for causal in (False, True):
                shape = (B, H, n, n, d)
                rng = np.random.default_rng(n + d)
                q, k, v = (rng.standard_normal((B, H, n, d), dtype=np.float32) for _ in range(3))
                tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
                tout = torch.empty((B, H, n, d), device="cuda")
                tlse = torch.empty((B, H, n), device="cuda")
                rec = dict(run=run, env=env, shape=shape, dtype="float32", causal=causal)
                try:
                    p = plan_for(q, k, v, causal=causal)
                    call = kernel_call(p, tq, tk, tv, tout, tlse)
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    # correctness: 2 heads of batch 0 against float64 SDPA (math) on the GPU
                    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
                        q64, k64, v64 = (t[:1, :2].double() for t in (tq, tk, tv))
                        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
                        s = (q64 @ k64.transpose(-1, -2)) * d ** -0.5
                        if causal:
                            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), -torch.inf)
                        ref_lse = torch.logsumexp(s, -1)
                        del s
                        naive = naive_torch(tq[:1, :2], tk[:1, :2], tv[:1, :2], causal)
                    err = (tout[:1, :2].double() - ref).abs()
                    atol, rtol = checks.tolerance(np.float32)
                    ok = bool((err <= atol + rtol * ref.abs()).all())
                    lse_err = float((tlse[:1, :2].double() - ref_lse).abs().max())
                    naive_err = float((naive.double() - ref).abs().max())
                    bench.log(f"large {shape} causal={causal}: max err {float(err.max()):.3g} (naive torch fp32 "
                              f"{naive_err:.3g}), lse err {lse_err:.3g}, within atol {atol:g} rtol {rtol:g}: {ok}")
                    out.write({"benchmark": "gpu_attention_large", "run": run, "shape": shape,
                               "causal": causal, "max_abs_err": float(err.max()),
                               "naive_torch_fp32_max_abs_err": naive_err, "lse_max_abs_err": lse_err,
                               "within_float32_rule": ok, "rule": f"atol {atol:g}, rtol {rtol:g}",
                               "compared": "batch 0, heads 0-1, vs float64 SDPA math on the GPU",
                               "environment": env})
                    del ref, naive, err, q64, k64, v64
                    if timing:
                        reps = args.repeats
                        t, ts = cuda_timer(call, reps, 2)
                        bench_rec("flash_numba_cuda", t, ts, out, **rec, block_q=p.launch.Br, block_k=p.launch.Bc,
                                  first_call_s=first, resources=resources(p))
                        for impl, fn in peers(tq, tk, tv, causal).items():
                            t, ts = cuda_timer(fn, reps, 2)
                            bench_rec(impl, t, ts, out, **rec)
                except Exception:  # noqa: BLE001
                    bench.log(traceback.format_exc())
                del tq, tk, tv, tout, tlse
                torch.cuda.empty_cache()


naive_torch = bench.torch_naive


def peers(tq, tk, tv, causal):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), torch.no_grad():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def naive():
        with torch.no_grad():
            return naive_torch(tq, tk, tv, causal)
    return {"torch_naive": naive, "torch_sdpa_efficient": sdpa}


def bench_rec(impl, t, ts, out, run, env, shape, dtype, causal, benchmark="gpu_attention", **extra):
    rec = bench.record(benchmark=benchmark, impl=impl, shape=shape, dtype=dtype, time_s=t, causal=causal,
                       run=run, env=env, repeats=len(ts), warmup=2, times_ms=[round(x, 4) for x in ts],
                       timer="CUDA events around each launch, median", **extra)
    bench.log(f"time {benchmark} {impl:22s} {tuple(shape)} causal={causal}: {t * 1e3:9.3f} ms  "
              f"{rec['tflops']:6.2f} TFLOP/s {extra.get('resources', '')}")
    out.write(rec)


def part_blocks(args, out, run, env, d):
    import torch
    n = 4096
    B, H = args.tokens // n, args.heads
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, H, n, d), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    tout, tlse = torch.empty((B, H, n, d), device="cuda"), torch.empty((B, H, n), device="cuda")
    ref = None
    for Br in (32, 64, 128, 256):
        for Bc in (16, 32, 64):
            if Bc * 2 * d * 4 > fnc.SHARED_BYTES:
                continue
            try:
                p = plan_for(q, k, v, block_q=Br, block_k=Bc)
                call = kernel_call(p, tq, tk, tv, tout, tlse)
                t, ts = cuda_timer(call, args.repeats, 2)
                if ref is None:
                    ref = tout.clone()
                same = float((tout - ref).abs().max())
                bench_rec("flash_numba_cuda", t, ts, out, run=run, env=env, shape=(B, H, n, n, d),
                          dtype="float32", causal=False, benchmark="gpu_attention_blocks",
                          block_q=Br, block_k=Bc, resources=resources(p), max_diff_to_first=same)
            except Exception:  # noqa: BLE001
                bench.log(traceback.format_exc())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "records" / "gpu_attention.jsonl"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16384, help="B = tokens / N")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", nargs="+", default=["check", "blocks", "large"])
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if fnc.where() != "gpu":
        sys.exit(f"no GPU here (flash_numba_cuda runs in the {fnc.where()}); this benchmark needs one")
    run, env = bench.new_run(), bench.gpu_environment()
    bench.log(json.dumps(env))
    with bench.RecordFile(args.out) as out:
        if "check" in args.parts:
            part_check(out, run, env)
        if "blocks" in args.parts:
            for d in args.head_dims:
                part_blocks(args, out, run, env, d)
        if "large" in args.parts:
            part_large(args, out, run, env, timing=True)
    bench.log(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
