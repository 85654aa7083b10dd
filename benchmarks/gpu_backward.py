"""Chapter 12's backward on a GPU: the CUDA backward (backward impl ``flash_numba_cuda``, float32 SIMT) checked,
then timed beside PyTorch's SDPA backward in the same run.

    python benchmarks/gpu_backward.py --out notebooks/records/gpu_backward.jsonl

Needs a CUDA GPU, numba-cuda and torch; a benchmark, not a test.  Parts:
- ``check``: the simulator's awkward cases (``course_lib.bench.cases``) and a larger tail / GQA / causal one, through
  ``course_lib.attention_backward`` against the float64 gradient (``checks.check_attention_backward``);
- ``time``: B*H = 64, N = 4096, D = 64 / 128, causal or not: the two kernels (CUDA events around the launches
  on device arrays, median of 10 after warm-up) beside ``torch.autograd.grad`` through SDPA's efficient and
  math backends in float32 (TF32 off).
- ``check_mma``: the tensor-core backward (backward impl ``cuda_mma_f16``, float16 / bfloat16 on mma.sync)
  at the same cases (``CASES``: both parts run every one) in float16, a bfloat16 one and D = 64 / 128 ones
  with tails, GQA and causal;
- ``time_mma``: the same shapes in float16, its two kernels beside PyTorch's fp16 backwards (FlashAttention-2,
  cuDNN, efficient: all on the fp16 tensor cores), with each kernel's registers and spills.
"""
from __future__ import annotations

import argparse

import numpy as np

import course_lib
from course_lib import bench, checks
from course_lib.bench.cases import BACKWARD_CASES, run_backward_case
from course_lib.bench.peers import peer_runs_on
from course_lib.core.backward_options import call_backward
from course_lib.kernels import backward_numba_cuda as bk
from course_lib.kernels.tensor_cores import backward as tb

OUT = RUN = ENV = None


# the simulator's awkward cases and two at a GPU's sizes: (B, H, Hk, Nq, Nk, D, Dv, options)
CASES = {**BACKWARD_CASES, "long_tails_gqa_causal_d64": (2, 8, 2, 300, 333, 64, 64, {"causal": True}),
         "window_d128": (1, 4, 4, 257, 391, 128, 128, {"window_size": (100, 3)})}


def part_check():
    for name, case in CASES.items():
        v = run_backward_case(name, case)
        print(f"check {name}: {v}", flush=True)
        OUT.write({"benchmark": "gpu_backward_check", "impl": "flash_numba_cuda", "case": name,
                   "shape": list(case[:7]), "options": case[7], "verdict": v})


def part_time():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.backends.cuda.matmul.allow_tf32 = False
    for D in (64, 128):
        for causal in (False, True):
            B, H, N = 4, 16, 4096
            rng = np.random.default_rng(D)
            q, k, v = (rng.standard_normal((B, H, N, D)).astype(np.float32) for _ in range(3))
            out, lse = course_lib.attention(q, k, v, impl="flash_numba_cuda", return_lse=True, causal=causal)
            dout = rng.standard_normal(out.shape).astype(np.float32)
            got = {}

            def grab(q, k, v, out, lse, dout, opts, mask):
                got["go"] = bk.launcher(q, k, v, out, lse, dout, opts, mask)
                return None, None, None
            call_backward(grab, q, k, v, out, lse.astype(np.float32), dout, causal=causal)
            go = got["go"][0]
            go()
            flops = 2.5 * 4.0 * B * H * N * N * D * (0.5 if causal else 1.0)    # 5 matmuls of the forward's 2
            timings = {"flash_numba_cuda": go}
            tq, tk, tv = (torch.from_numpy(x).cuda().requires_grad_() for x in (q, k, v))
            tdo = torch.from_numpy(dout).cuda()
            for name, backend in (("torch_sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                                  ("torch_sdpa_math", SDPBackend.MATH)):
                with sdpa_kernel(backend):
                    tout = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                timings[name] = (lambda o=tout: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True))
            for name, fn in timings.items():
                try:
                    median, times = bench.cuda_time_it(fn, 10, warmup=2)
                except Exception as error:  # noqa: BLE001
                    print(name, D, causal, "failed:", error, flush=True)
                    continue
                print(f"time {name:22s} D={D} causal={causal}: {median * 1e3:8.2f} ms {flops / median / 1e12:6.2f} TFLOP/s",
                      flush=True)
                OUT.write({"benchmark": "gpu_backward_time", "impl": name, "D": D, "causal": causal,
                           "shape": [B, H, N, N, D], "median_s": median, "times_ms": times, "flops": flops,
                           "tflops": flops / median / 1e12, "layer": "kernel", "dtype": "float32"})


MMA_CASES = {   # name: (B, H, Hk, Nq, Nk, D, Dv, options, dtype)
    "long_tails_gqa_causal_d64": (2, 8, 2, 300, 333, 64, 64, {"causal": True}, "float16"),
    "window_d128": (1, 4, 4, 257, 391, 128, 128, {"window_size": (100, 3)}, "float16"),
    "softcap_alibi_d128_bf16": (1, 4, 2, 200, 190, 128, 128, {"softcap": 5.0, "alibi_slopes": [0.5, 0.25, 0.1, 0.05]},
                                "bfloat16"),
    "odd_dims_mqa": (2, 3, 1, 77, 130, 40, 24, {"causal": True, "causal_align": "top_left"}, "float16"),
}


def part_check_mma():
    import ml_dtypes
    cases = {n: (*c, "float16") for n, c in CASES.items()}
    cases.update(MMA_CASES)
    for name, (B, H, Hk, Nq, Nk, D, Dv, options, dtype) in cases.items():
        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        opts = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
        rng = np.random.default_rng(7)
        q, k, v = (rng.standard_normal(s).astype(dt) for s in ((B, H, Nq, D), (B, Hk, Nk, D), (B, Hk, Nk, Dv)))
        out, lse = course_lib.attention(q, k, v, impl="reference", return_lse=True, **opts)
        out, lse = out.astype(dt), lse.astype(np.float32)
        dout = rng.standard_normal(out.shape).astype(dt)

        def go():
            grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl="cuda_mma_f16", **opts)
            assert all(g.dtype == q.dtype and not np.isnan(g.astype(np.float32)).any() for g in grads), \
                "a gradient nobody wrote, or not in q's dtype"
            checks.check_attention_backward(grads, q, k, v, out, lse, dout, **opts)
        v_ = bench.verdict(go)
        print(f"check_mma {name}: {v_}", flush=True)
        OUT.write({"benchmark": "gpu_backward_check", "impl": "cuda_mma_f16", "case": name, "dtype": dtype,
                   "shape": [B, H, Hk, Nq, Nk, D, Dv], "options": options, "verdict": v_})


def part_time_mma():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for D in (64, 128):
        for causal in (False, True):
            B, H, N = 4, 16, 4096
            rng = np.random.default_rng(D)
            q, k, v = (rng.standard_normal((B, H, N, D)).astype(np.float16) for _ in range(3))
            out, lse = course_lib.attention(q, k, v, impl="cuda_mma_f16", return_lse=True, causal=causal)
            dout = rng.standard_normal(out.shape).astype(np.float16)
            got = {}

            def grab(q, k, v, out, lse, dout, opts, mask):
                got["go"] = tb.launcher(q, k, v, out, lse, dout, opts, mask)
                return None, None, None
            call_backward(grab, q, k, v, out, lse.astype(np.float32), dout, causal=causal)
            go = got["go"][0]
            go()
            flops = 2.5 * 4.0 * B * H * N * N * D * (0.5 if causal else 1.0)
            tiling = tb.default_tiling("f16", D, D)
            resources = {}
            for label, kernel in zip(("dkdv", "dq"), tb.make_kernels("f16", tiling, D, D)):
                one = lambda x: list(x.values())[0] if isinstance(x, dict) else x
                resources[label] = {"registers": one(kernel.get_regs_per_thread()),
                                    "local_bytes": one(kernel.get_local_mem_per_thread()),
                                    "shared_bytes": one(kernel.get_shared_mem_per_block())}
            timings = {"cuda_mma_f16": go}
            tq, tk, tv = (torch.from_numpy(x).cuda().requires_grad_() for x in (q, k, v))
            tdo = torch.from_numpy(dout).cuda()
            for name, backend in (("torch_sdpa_flash", SDPBackend.FLASH_ATTENTION),
                                  ("torch_sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("torch_sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        tout = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                except Exception as error:  # noqa: BLE001
                    print(name, D, causal, "failed:", error, flush=True)
                    continue
                timings[name] = (lambda o=tout: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True))
            for name, fn in timings.items():
                try:
                    median, times = bench.cuda_time_it(fn, 10, warmup=2)
                except Exception as error:  # noqa: BLE001
                    print(name, D, causal, "failed:", error, flush=True)
                    continue
                print(f"time_mma {name:22s} D={D} causal={causal}: {median * 1e3:8.2f} ms "
                      f"{flops / median / 1e12:6.2f} TFLOP/s", flush=True)
                rec = {"benchmark": "gpu_backward_time", "impl": name, "D": D, "causal": causal,
                       "shape": [B, H, N, N, D], "median_s": median, "times_ms": times, "flops": flops,
                       "tflops": flops / median / 1e12, "layer": "kernel", "dtype": "float16",
                       "runs_on": "mma.sync m16n8k16, fp32 accumulation" if name == "cuda_mma_f16"
                       else peer_runs_on(name, "float16")}
                if name == "cuda_mma_f16":
                    rec.update(tiling={"warps": tiling.warps, "Bi": tiling.Bi}, resources=resources)
                OUT.write(rec)


PARTS = {"check": part_check, "time": part_time, "check_mma": part_check_mma, "time_mma": part_time_mma}


def main():
    global OUT, RUN, ENV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=["check", "time"], choices=list(PARTS))
    args = parser.parse_args()
    RUN, ENV = bench.new_run(), bench.gpu_environment()
    with bench.RecordFile(args.out, run=RUN, run_id=RUN, environment=ENV) as OUT:
        for part in args.parts:
            PARTS[part]()


if __name__ == "__main__":
    main()
