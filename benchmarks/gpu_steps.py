"""Chapter 10's kernel steps on a GPU, checked, tuned and timed beside PyTorch in one run.

    python benchmarks/gpu_steps.py --out notebooks/records/gpu_steps.jsonl [--parts ...]

Needs a CUDA GPU, numba-cuda and torch (a benchmark, not a test: nothing here
asserts a speed).  Every record carries ``benchmark`` (the part), ``run_id``
(one per invocation: ratios are only taken inside one) and ``layer`` (what the
time covers: ``kernel`` = CUDA events around launches on device arrays).

Parts, in the order they run:

- ``check``: every step (and split-KV) through ``cuda_steps.attention`` against
  the float64 reference at small awkward shapes (tails, Nq != Nk, GQA, masks);
- ``tune``: the autotuner's candidates at B*H = 64, N = 4096, per head dim,
  each checked against the first candidate's output, the choice recorded;
- ``steps``: every step and every peer (torch_naive, torch_sdpa_efficient,
  torch_sdpa_math in fp32, torch_sdpa_flash and torch_sdpa_cudnn in fp16) at
  B*H = 64, N = 4096 and the sizes in ``--sizes``, D 64 / 128, causal or not;
  the tuned kernel's output checked against float64 SDPA at each shape;
- ``causal``: the tuned kernel causal vs not at N = 8192;
- ``decode``: Nq = 1, Nk = 32K, B = 8, H = 16: one block per (b, h) against
  split-KV with its lse merge (splits swept, and ``cs.decode_splits``'s choice
  recorded as ``gpu_steps_decode_rule``), beside SDPA;
- ``layers``: kernel time vs the host's cost of a launch vs end to end from
  numpy, N from 64 to 4096 at B*H = 64, beside torch's kernels;
- ``masks``: one shape, the mask varied (none, causal, window, softcap, ALiBi),
  and SDPA given a causal mask as a tensor instead of ``is_causal``;
- ``chain`` (not in the default list): ``tiled_prefetch`` to ``tiled_vec4`` one change at a
  time, alternated over ``--rounds`` rounds beside naive torch;
- ``sanitize`` (not in the default list): small launches for compute-sanitizer,
  run by ``benchmarks/gpu_sanitize.py``.

The committed records were made with ``--sizes 1024 4096 16384``.

TF32 is off for the fp32 torch peers, so naive torch's cuBLAS matmuls and SDPA's
math backend compute on the SIMT cores, as the course's kernels do.  SDPA's
memory-efficient kernel does not read that switch: its CUTLASS kernel
(fmha_cutlassF_f32_*_sm80) computes each fp32 matmul on the tensor cores as
three TF32 products (3xTF32, OpMultiplyAddFastF32).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from course_lib import bench, checks
from course_lib.core import hardware
from course_lib.core.options import call_forward
from course_lib.kernels import cuda_steps as cs

ROOT = Path(__file__).resolve().parent.parent

OUT = None
RUN = None
ENV = None


cuda_timer = bench.cuda_time_it    # the kernel layer: CUDA events around each call


def plan_for(step, q, k, v, tiling=None, splits=1, **options):
    got = {}

    def grab(q, k, v, opts, mask):
        got["plan"] = cs.plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v, **options)
    return got["plan"]


class Problem:
    """Inputs on the device (torch tensors), their numpy twins' shapes, output buffers."""

    def __init__(self, B, H, Nq, Nk, D, seed=0, Hk=None):
        import torch
        Hk = Hk or H
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.q = torch.randn((B, H, Nq, D), device="cuda", generator=g)
        self.k = torch.randn((B, Hk, Nk, D), device="cuda", generator=g)
        self.v = torch.randn((B, Hk, Nk, D), device="cuda", generator=g)
        self.out = torch.empty((B, H, Nq, D), device="cuda")
        self.lse = torch.empty((B, H, Nq), device="cuda")
        self.shape = (B, H, Nq, Nk, D)

    def host_like(self):
        """Zero-length numpy stand-ins with the right shapes (the plan reads only shapes)."""
        B, H, Nq, Nk, D = self.shape
        return (np.empty((B, H, Nq, D), np.float32), np.empty((B, self.k.shape[1], Nk, D), np.float32),
                np.empty((B, self.k.shape[1], Nk, D), np.float32))

    def call(self, step, tiling=None, splits=1, **options):
        import torch
        from numba import cuda
        p = plan_for(step, *self.host_like(), tiling=tiling, splits=splits, **options)
        args = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args)
        from dataclasses import replace
        p = replace(p, args=args)
        dq, dk, dv, dout, dlse = (cuda.as_cuda_array(t) for t in (self.q, self.k, self.v, self.out, self.lse))
        parts = (None, None)
        if p.splits > 1:
            B, H, Nq, Nk, D = self.shape
            self._po = torch.empty((p.splits, B, H, Nq, D), device="cuda")
            self._pl = torch.empty((p.splits, B, H, Nq), device="cuda")
            parts = (cuda.as_cuda_array(self._po), cuda.as_cuda_array(self._pl))
        return p, cs.launcher(p, dq, dk, dv, dout, dlse, *parts)


naive_torch = bench.torch_naive


def peers(pr, causal, which=None):
    """{impl: (callable, dtype)} on the problem's inputs (fp16 copies made once, outside the timing)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = pr.q, pr.k, pr.v
    h = [t.half() for t in (q, k, v)]

    def sdpa(backend, tensors):
        def go():
            with sdpa_kernel(backend), torch.no_grad():
                return F.scaled_dot_product_attention(*tensors, is_causal=causal)
        return go
    table = {
        "torch_naive": (lambda: naive_torch(q, k, v, causal), "float32"),
        "torch_sdpa_efficient": (sdpa(SDPBackend.EFFICIENT_ATTENTION, (q, k, v)), "float32"),
        "torch_sdpa_math": (sdpa(SDPBackend.MATH, (q, k, v)), "float32"),
        "torch_sdpa_flash": (sdpa(SDPBackend.FLASH_ATTENTION, h), "float16"),
        "torch_sdpa_cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION, h), "float16"),
    }
    return {name: table[name] for name in (which or table)}


def time_record(benchmark, impl, fn, shape, dtype, causal, repeats, **extra):
    try:
        t, ts = cuda_timer(fn, repeats)
    except Exception as error:  # noqa: BLE001 -- a peer that does not run here is recorded as such
        bench.log(f"{benchmark} {impl} {shape} causal={causal}: FAILED {type(error).__name__}: {str(error)[:200]}")
        OUT.write({"benchmark": benchmark, "run_id": RUN, "run": RUN, "impl": impl, "shape": list(shape),
                   "causal": causal, "dtype": dtype, "error": f"{type(error).__name__}: {str(error)[:500]}",
                   "environment": ENV})
        return None
    rec = bench.record(benchmark=benchmark, impl=impl, shape=shape, dtype=dtype, time_s=t, causal=causal,
                       run=RUN, env=ENV, layer="kernel", device=ENV["gpu"], repeats=len(ts), warmup=2,
                       times_ms=[round(x, 4) for x in ts], timer="CUDA events around each launch, median",
                       **extra)
    OUT.write(rec)
    res = extra.get("resources", "")
    bench.log(f"{benchmark:8s} {impl:26s} {str(tuple(shape)):28s} c={int(causal)} {t * 1e3:9.3f} ms "
              f"{rec['tflops']:7.2f} TFLOP/s {res}")
    return rec


def step_extra(p):
    res = cs.resources(p.kernel)
    extra = {"resources": res, "threads": p.blockdim, "dynamic_shared": p.shared, "splits": p.splits}
    if p.tiling is not None:
        extra["tiling"] = p.tiling.__dict__ if hasattr(p.tiling, "__dict__") else str(p.tiling)
        extra["block_q"], extra["block_k"] = p.tiling.Br, p.tiling.Bc
    else:
        extra["block_q"], extra["block_k"] = p.launch.Br, p.launch.Bc
    regs = res.get("regs_per_thread")
    if isinstance(regs, int):
        shared = p.shared + (res.get("shared_mem_per_block") or 0 if isinstance(res.get("shared_mem_per_block"), int) else 0)
        extra["occupancy"] = hardware.occupancy("h200", regs, shared, p.blockdim).as_record()
    return extra


def accuracy(pr, causal, heads=2):
    """Max error of pr.out (2 heads of batch 0) vs float64 SDPA math, beside naive torch fp32's."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        q64, k64, v64 = (t[:1, :heads].double() for t in (pr.q, pr.k, pr.v))
        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        naive = naive_torch(pr.q[:1, :heads], pr.k[:1, :heads], pr.v[:1, :heads], causal)
    err = (pr.out[:1, :heads].double() - ref).abs()
    atol, rtol = checks.tolerance(np.float32)
    within = bool((err <= atol + rtol * ref.abs()).all())
    naive_err = float((naive.double() - ref).abs().max())
    ok = within or float(err.max()) <= 2 * naive_err + 1e-6
    return {"max_abs_err": float(err.max()), "naive_torch_fp32_max_abs_err": naive_err, "ok": ok,
            "rule": f"within atol {atol:g} + rtol {rtol:g} |ref|, or at most 2 x naive fp32's max error",
            "compared": f"batch 0, heads 0-{heads - 1}, vs float64 SDPA math on the GPU"}


# -- the parts ------------------------------------------------------------------------------------

def part_check(args):
    rng = np.random.default_rng(0)
    cases = [
        ((2, 4, 2, 203, 333, 64, 64), dict(causal=True)),
        ((1, 4, 1, 333, 203, 64, 64), dict(causal=True, causal_align="top_left")),
        ((2, 2, 2, 257, 257, 128, 128), dict(window_size=(40, 7))),
        ((1, 3, 3, 100, 517, 96, 96), dict(softcap=30.0, alibi_slopes=np.array([0.5, 0.1, 0.02]))),
        ((1, 2, 2, 1, 4099, 64, 64), dict()),
        ((1, 2, 1, 64, 1000, 40, 24), dict(window_size=(3, 3))),
    ]
    for shape, opts in cases:
        B, H, Hk, Nq, Nk, D, Dv = shape
        q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
        k = rng.standard_normal((B, Hk, Nk, D)).astype(np.float32)
        v = rng.standard_normal((B, Hk, Nk, Dv)).astype(np.float32)
        for step in cs.SIMT_STEPS:
            for splits in ((1, 4) if step == "tuned" else (1,)):
                try:
                    o, lse = cs.attention(q, k, v, step=step, splits=splits, return_lse=True, **opts)
                    checks.check_attention(o, q, k, v, lse=lse, **opts)
                    verdict = "PASS"
                except Exception as error:  # noqa: BLE001
                    verdict = f"FAIL {type(error).__name__}: {str(error)[:1500]}"
                    bench.log(traceback.format_exc()[-1500:])
                bench.log("check", step, splits, shape, {a: b for a, b in opts.items() if a != "alibi_slopes"},
                          verdict[:200])
                OUT.write({"benchmark": "gpu_steps_check", "run_id": RUN, "run": RUN, "step": step, "splits": splits,
                           "shape": shape, "options": {a: (b.tolist() if isinstance(b, np.ndarray) else b)
                                                       for a, b in opts.items()},
                           "verdict": verdict, "environment": ENV})


def part_tune(args):
    n = 4096
    for D in args.head_dims:
        pr = Problem(64 // 16, 16, n, n, D, seed=D)
        first = {}

        def time_plan(tiling):
            try:
                p, call = pr.call("tuned", tiling=tiling)
                call()
                import torch
                torch.cuda.synchronize()
                if "ref" not in first:
                    first["ref"] = pr.out.clone()
                diff = float((pr.out - first["ref"]).abs().max())
                rec = time_record("gpu_steps_tune", "cuda_tiled", call, pr.shape, "float32", False, args.repeats,
                                  max_diff_to_first=diff, **step_extra(p))
                if rec is None or not diff < 1e-3:
                    return None
                return rec["time_s"]
            except Exception as error:  # noqa: BLE001
                bench.log(f"tune D={D} {tiling}: FAILED {type(error).__name__}: {str(error)[:300]}")
                OUT.write({"benchmark": "gpu_steps_tune", "run_id": RUN, "run": RUN, "impl": "cuda_tiled",
                           "shape": list(pr.shape), "tiling": tiling.__dict__, "error": f"{type(error).__name__}: "
                           f"{str(error)[:500]}", "environment": ENV})
                return None
        cands = CANDIDATES[D]
        best, results = cs.autotune(D, time_plan, candidates=cands, prefetch=(True,), base=TUNE_BASE)
        bench.log(f"tuned D={D}: {best}")
        OUT.write({"benchmark": "gpu_steps_tuned", "run_id": RUN, "run": RUN, "D": D, "tiling": best.__dict__,
                   "timed": [[t.__dict__, s] for t, s in results], "environment": ENV})
        pr = None  # free the GPU arrays before the next size


# The autotuner's candidates for ``tuned`` (tiled_staged's kernel: 16-byte shared loads, K / V staged
# through registers), (Br, Bc, threads, tx[, register cap]).  Chosen around what an exploration on
# the H200 found (benchmarks/vec_explore.py): 128-row blocks of 256 threads, 64-key tiles.
TUNE_BASE = cs.Tiling(pad=4, prefetch=True, vec=True)
CANDIDATES = {
    64: [(128, 64, 256, 8), (128, 64, 256, 16), (64, 64, 128, 8), (64, 32, 128, 8, 128), (128, 32, 256, 16)],
    128: [(128, 64, 256, 16), (128, 32, 256, 16), (128, 32, 256, 8), (64, 32, 128, 8), (64, 32, 256, 16, 128)],
}


def part_steps(args):
    import torch
    for n in args.sizes:
        B = max(1, args.tokens // n)
        for D in args.head_dims:
            for causal in (False, True):
                pr = Problem(B, 16, n, n, D, seed=n + D)
                for step in cs.SIMT_STEPS:
                    try:
                        p, call = pr.call(step, causal=causal)
                        extra = {}
                        if step == "tuned":
                            call()
                            torch.cuda.synchronize()
                            extra["accuracy"] = accuracy(pr, causal)
                            bench.log("accuracy", pr.shape, causal, extra["accuracy"])
                        time_record("gpu_steps", f"cuda_{step}", call, pr.shape, "float32", causal, args.repeats,
                                    step=step, **step_extra(p), **extra)
                    except Exception as error:  # noqa: BLE001
                        bench.log(f"step {step} {pr.shape}: FAILED {type(error).__name__}: {str(error)[:300]}")
                        bench.log(traceback.format_exc()[-1200:])
                for impl, (fn, dtype) in peers(pr, causal).items():
                    if impl == "torch_sdpa_math" and n > 8192:
                        continue
                    time_record("gpu_steps", impl, fn, pr.shape, dtype, causal, args.repeats)
                pr = None  # free the GPU arrays before the next size
                torch.cuda.empty_cache()


# tiled_prefetch to tiled_vec4, one change a step (cs.SIMT_STEPS holds them in this order)
CHAIN = ("tiled_prefetch", "tiled_rebuilt", "tiled_shuffle", "tiled_reorder", "tiled_aligned", "tiled_vec4")


def part_chain(args):
    """The chain's steps and naive torch at B*H = 64, N = 4096, causal or not, timed in rounds that
    alternate them, so that a change of a few percent is measured against a neighbour timed moments
    before, not against a record of another run."""
    import torch
    n = 4096
    for D in args.head_dims:
        for causal in (False, True):
            pr = Problem(max(1, args.tokens // n), 16, n, n, D, seed=n + D)
            calls = {step: pr.call(step, causal=causal) for step in CHAIN}
            naive = peers(pr, causal, ["torch_naive"])["torch_naive"][0]
            for rnd in range(args.rounds):
                for step in CHAIN:
                    p, call = calls[step]
                    time_record("gpu_steps_chain", f"cuda_{step}", call, pr.shape, "float32", causal, args.repeats,
                                step=step, round=rnd, **step_extra(p))
                time_record("gpu_steps_chain", "torch_naive", naive, pr.shape, "float32", causal, args.repeats,
                            round=rnd)
            pr = calls = None  # free the GPU arrays before the next size
            torch.cuda.empty_cache()


def part_causal(args):
    import torch
    n = 8192
    for D in args.head_dims:
        for causal in (False, True):
            pr = Problem(2, 16, n, n, D, seed=D)
            p, call = pr.call("tuned", causal=causal)
            time_record("gpu_steps_causal", "cuda_tuned", call, pr.shape, "float32", causal, args.repeats,
                        computed_tiles=p.launch.computed_tiles, tiles=int(p.launch.tiles.size), **step_extra(p))
            for impl in ("torch_naive", "torch_sdpa_efficient"):
                time_record("gpu_steps_causal", impl, peers(pr, causal, [impl])[impl][0], pr.shape, "float32",
                            causal, args.repeats)
            pr = None  # free the GPU arrays before the next size
            torch.cuda.empty_cache()


def part_decode(args):
    """Decode with one block per (b, h) against split-KV and its lse merge: the splits swept, and the
    rule ``cs.decode_splits`` (enough blocks for DECODE_WAVES full waves) recorded with its choice."""
    import torch
    for D in args.head_dims:
        pr = Problem(8, 16, 1, 32768, D, seed=7)
        tiling = cs.DECODE_TILING
        ref = None
        regs = 64
        for splits in (1, 4, 8, 16, 32, 64, 128):
            try:
                p, call = pr.call("tuned", tiling=tiling, splits=splits)
                call()
                torch.cuda.synchronize()
                if ref is None:
                    acc = accuracy(pr, False)
                    ref = pr.out.clone()
                    got = cs.resources(p.kernel).get("regs_per_thread")
                    regs = got if isinstance(got, int) else regs
                else:
                    acc = {"max_diff_to_unsplit": float((pr.out - ref).abs().max())}
                    acc.update(accuracy(pr, False))
                time_record("gpu_steps_decode", "cuda_split_kv" if splits > 1 else "cuda_no_split", call,
                            pr.shape, "float32", False, args.repeats, accuracy=acc, **step_extra(p))
            except Exception as error:  # noqa: BLE001
                bench.log(f"decode splits={splits}: FAILED {type(error).__name__}: {str(error)[:300]}")
                bench.log(traceback.format_exc()[-1200:])
        rows = 8 * 16 * 1
        n_tiles = -(-32768 // tiling.Bc)
        chosen, inputs = cs.decode_splits(rows, n_tiles, tiling, D, D, regs=regs)
        OUT.write({"benchmark": "gpu_steps_decode_rule", "run_id": RUN, "run": RUN, "D": D, "splits": chosen,
                   "rule": "fewest splits (a power of two) with B*H*splits >= DECODE_WAVES x SMs x blocks per SM",
                   "inputs": inputs, "tiling": tiling.__dict__, "environment": ENV})
        bench.log(f"decode D={D}: the rule chooses {chosen} splits {inputs}")
        for impl, (fn, dtype) in peers(pr, False).items():
            time_record("gpu_steps_decode", impl, fn, pr.shape, dtype, False, args.repeats)
        pr = None  # free the GPU arrays before the next size
        torch.cuda.empty_cache()


def part_layers(args):
    """At B*H = 64 and N from 64 up: kernel time (events), the host's cost of one launch (not waiting)
    and end to end (numpy in, numpy out), beside torch's kernels: where launch overhead dominates."""
    import torch
    D = 64
    for n in (64, 128, 256, 512, 1024, 2048, 4096):
        pr = Problem(4, 16, n, n, D, seed=3)
        p, call = pr.call("tuned")
        time_record("gpu_steps_layers", "cuda_tuned", call, pr.shape, "float32", False, args.repeats, **step_extra(p))
        for impl in ("torch_naive", "torch_sdpa_efficient"):
            time_record("gpu_steps_layers", impl, peers(pr, False, [impl])[impl][0], pr.shape, "float32", False,
                        args.repeats)
        torch.cuda.synchronize()
        starts = []
        for _ in range(20):
            t0 = time.perf_counter()
            call()
            starts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        t = statistics.median(starts)
        OUT.write(bench.record(benchmark="gpu_steps_layers", impl="cuda_tuned", shape=pr.shape, dtype="float32",
                               time_s=t, run=RUN, env=ENV, layer="launch", device=ENV["gpu"],
                               timer="host perf_counter around the (asynchronous) launch call, median of 20"))
        q, k, v = (x.cpu().numpy() for x in (pr.q, pr.k, pr.v))
        cs.attention(q, k, v, step="tuned")
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            cs.attention(q, k, v, step="tuned")
            ts.append(time.perf_counter() - t0)
        OUT.write(bench.record(benchmark="gpu_steps_layers", impl="cuda_tuned", shape=pr.shape, dtype="float32",
                               time_s=statistics.median(ts), run=RUN, env=ENV, layer="end to end", device=ENV["gpu"],
                               timer="host perf_counter around cuda_steps.attention(numpy...), copies included, "
                                     "median of 5"))
        bench.log(f"layers {pr.shape}: launch {t * 1e6:.1f} us, end to end {statistics.median(ts) * 1e3:.2f} ms")
        pr = None  # free the GPU arrays before the next size


MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window (256, 0)": {"window_size": (256, 0)},
    "softcap 30": {"softcap": 30.0},
    "alibi": {"alibi": True},
}


def part_masks(args):
    """One shape, the mask varied: our kernel (tiles skipped or masked on the host's plan) and SDPA
    with is_causal against SDPA given the same causal mask as a tensor (a slower path)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    n, D = 4096, 64
    pr = Problem(4, 16, n, n, D, seed=11)
    for name, opts in MASKS.items():
        opts = dict(opts)
        if opts.pop("alibi", False):
            opts["alibi_slopes"] = np.array([2.0 ** (-8 * (h + 1) / 16) for h in range(16)])
        p, call = pr.call("tuned", **opts)
        window = opts.get("window_size", (-1, -1))
        time_record("gpu_steps_masks", "cuda_tuned", call, pr.shape, "float32", opts.get("causal", False),
                    args.repeats, mask=name, window_size=window if not opts.get("causal") else (-1, -1),
                    computed_tiles=p.launch.computed_tiles, tiles=int(p.launch.tiles.size), **step_extra(p))
    bool_mask = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        def flag(backend=backend):
            with sdpa_kernel(backend), torch.no_grad():
                return F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=True)

        def tensor(backend=backend):
            with sdpa_kernel(backend), torch.no_grad():
                return F.scaled_dot_product_attention(pr.q, pr.k, pr.v, attn_mask=bool_mask)
        short = "efficient" if backend == SDPBackend.EFFICIENT_ATTENTION else "math"
        time_record("gpu_steps_masks", f"torch_sdpa_{short}", flag, pr.shape, "float32", True, args.repeats,
                    mask="causal (is_causal)")
        time_record("gpu_steps_masks", f"torch_sdpa_{short}", tensor, pr.shape, "float32", True, args.repeats,
                    mask="causal (boolean attn_mask tensor)")


def part_sanitize(args):
    """Small launches of every micro-tiled kernel, for compute-sanitizer (racecheck / synccheck) to watch."""
    import contextlib
    import io
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 70, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float32) for _ in range(2))
    verdicts = []

    def check(*a, **kw):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            checks.check_attention(*a, **kw)
        verdicts.append(buf.getvalue().strip().splitlines()[-1])
    steps = ("tiled", "tiled_padded", "tiled_prefetch", "tiled_rebuilt", "tiled_shuffle", "tiled_reorder",
             "tiled_aligned", "tiled_vec4", "tiled_staged", "tuned")
    for step in steps:
        o, lse = cs.attention(q, k, v, step=step, causal=True, return_lse=True)
        check(o, q, k, v, lse=lse, causal=True)
    o, lse = cs.attention(q[:, :, :1], k, v, step="tuned", tiling=cs.DECODE_TILING, splits=3, return_lse=True)
    check(o, q[:, :, :1], k, v, lse=lse)
    bench.log("\n".join(verdicts))
    OUT.write({"benchmark": "gpu_steps_sanitize", "run_id": RUN, "run": RUN, "cases": len(verdicts),
               "steps": [*steps, "tuned split-KV decode"], "checks": verdicts, "environment": ENV})


def main(argv=None):
    global OUT, RUN, ENV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "notebooks" / "records" / "gpu_steps.jsonl"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--tokens", type=int, default=16384, help="B = tokens / N (B*H = 64 at N = 4096)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the chain part")
    parser.add_argument("--parts", nargs="+",
                        default=["check", "tune", "steps", "causal", "decode", "layers", "masks"])
    parser.add_argument("--tuned", default=None, help="a gpu_steps_tuned record file to take TUNED from")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not cs.on_gpu():
        sys.exit("no GPU here; this benchmark needs one")
    RUN, ENV = bench.new_run(), bench.gpu_environment()
    bench.log(json.dumps(ENV))
    if args.tuned:
        for r in bench.load_records(args.tuned, benchmark="gpu_steps_tuned"):
            cs.TUNED[r["D"]] = cs.Tiling(**r["tiling"])
    with bench.RecordFile(args.out) as OUT:
        for part in args.parts:
            t0 = time.perf_counter()
            try:
                globals()[f"part_{part}"](args)
            except Exception:  # noqa: BLE001
                bench.log(traceback.format_exc())
            bench.log(f"== part {part}: {time.perf_counter() - t0:.1f} s")
    bench.log(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
