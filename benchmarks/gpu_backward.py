"""Chapter 12's backward on a GPU: the CUDA backward (backward impl ``flash_numba_cuda``, float32 SIMT) checked,
then timed beside PyTorch's SDPA backward in the same run.

    python benchmarks/gpu_backward.py --out notebooks/records/gpu_backward.jsonl

Needs a CUDA GPU, numba-cuda and torch; a benchmark, not a test.  Parts:
- ``check``: tests/backward_cuda_sim.py's awkward cases and a larger tail / GQA / causal one, through
  ``course_lib.attention_backward`` against the float64 gradient (``checks.check_attention_backward``);
- ``time``: B*H = 64, N = 4096, D = 64 / 128, causal or not: the two kernels (CUDA events around the launches
  on device arrays, median of 10 after warm-up) beside ``torch.autograd.grad`` through SDPA's efficient and
  math backends in float32 (TF32 off).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

import course_lib  # noqa: E402
from course_lib import bench, checks  # noqa: E402
from course_lib.core.backward_options import call_backward  # noqa: E402
from course_lib.kernels import backward_numba_cuda as bk  # noqa: E402

OUT = RUN = ENV = None


def write(rec):
    OUT.write(json.dumps({"run": RUN, "run_id": RUN, "environment": ENV, **rec}, sort_keys=True, default=str) + "\n")
    OUT.flush()


def part_check():
    import backward_cuda_sim as sim
    sim.CASES["long_tails_gqa_causal_d64"] = (2, 8, 2, 300, 333, 64, 64, {"causal": True})
    sim.CASES["window_d128"] = (1, 4, 4, 257, 391, 128, 128, {"window_size": (100, 3)})
    for name in sim.CASES:
        v = sim.run_case(name)
        print(f"check {name}: {v}", flush=True)
        write({"benchmark": "gpu_backward_check", "impl": "flash_numba_cuda", "case": name,
               "shape": list(sim.CASES[name][:7]), "options": sim.CASES[name][7], "verdict": v})


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
                write({"benchmark": "gpu_backward_time", "impl": name, "D": D, "causal": causal,
                       "shape": [B, H, N, N, D], "median_s": median, "times_ms": times, "flops": flops,
                       "tflops": flops / median / 1e12, "layer": "kernel", "dtype": "float32"})


def main():
    global OUT, RUN, ENV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=["check", "time"], choices=["check", "time"])
    args = parser.parse_args()
    import gpu_steps
    RUN = time.strftime("%Y%m%dT%H%M%S+0000", time.gmtime())
    ENV = gpu_steps.environment()
    with open(args.out, "a") as OUT:
        for part in args.parts:
            {"check": part_check, "time": part_time}[part]()


if __name__ == "__main__":
    main()
