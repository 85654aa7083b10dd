"""The tensor-core steps (``kernels.tensor_cores``) on a GPU: checked, then timed beside PyTorch in one run.

    python benchmarks/gpu_mma.py --out notebooks/records/gpu_mma.jsonl [--parts check resources time causal decode]

Needs a CUDA GPU (sm_80 or newer), numba-cuda and torch; a benchmark, not a test.

- ``check``: every step (``mma_f16`` on float16 and on bfloat16, ``mma_tf32``, ``mma_3xtf32`` on float32)
  against the float64 reference through ``checks.check_attention`` (the tolerance grounded on a naive
  kernel of the same dtype) at awkward shapes: tails, Nq != Nk, odd head dims, GQA / MQA, causal both
  ways, windows, softcap + ALiBi, rows that see no key, split-KV; ``mma_tf32`` (one TF32 product: what
  ``allow_tf32`` gives) is expected to FAIL the float32 rule: it is the step that shows why 3xTF32.
- ``resources``: registers, spills (local memory) and shared memory of each kernel.
- ``time``: B*H = 64, N = 4096, D = 64 / 128, causal or not: mma_f16 beside torch_sdpa_flash and
  torch_sdpa_cudnn in fp16; mma_3xtf32 beside torch_sdpa_efficient (3xTF32 itself), torch_naive
  (TF32 off: SIMT) and chapter 10's cuda_tuned (SIMT) in fp32.  CUDA events, warm-up, median of 20.
- ``causal``: mma_f16 causal vs not at N = 8192.
- ``decode``: Nq = 1, Nk = 32K, B = 8, H = 16, D = 128, fp16: splits swept for the decode tiling (one warp a
  block) and for the prefill one, ``tc.decode_splits``' choice marked (``chosen``), beside FA2 and cuDNN.
- ``chain``: the last two steps, one change each on top of the tuned (register-staged) tiling: (c)
  ``ldmatrix`` from swizzled tiles, (d) ``cp.async`` into two stages; each checked at every awkward case,
  then timed at B*H = 64, N = 4096, D = 64 / 128 beside the peer of its dtype, with the cp.async
  tiling's warps and tile width swept (the fastest is this run's choice, ``gpu_mma_chain_tuned``).
  ``--chain-cases``, ``--chain-steps``, ``--chain-timed`` and ``--chain-timing-only`` narrow it to what a
  change touched (each kernel takes about 10 s to compile on the device machine: the full chain is ~10 min).
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import numpy as np

from course_lib import bench, checks
from course_lib.bench.cases import FORWARD_CASES
from course_lib.bench.peers import peer_runs_on
from course_lib.core import rules
from course_lib.core.options import call_forward
from course_lib.kernels import tensor_cores as tc

OUT = RUN = ENV = None
REPEATS = 20
STEP_DTYPES = [("mma_f16", "float16"), ("mma_f16", "bfloat16"), ("mma_tf32", "float32"), ("mma_3xtf32", "float32")]
if "--quick-check" in sys.argv:
    sys.argv.remove("--quick-check")
    STEP_DTYPES = [("mma_f16", "float16"), ("mma_3xtf32", "float32")]
# name: (B, H, Hk, Nq, Nk, D, Dv, options, splits): chapter 10's awkward cases (course_lib.bench.cases) without
# its split-KV ones, then head dims the fragments tile unevenly and split-KV at this kernel's tile size
CASES = {name: case for name, case in FORWARD_CASES.items() if case[-1] == 1}
CASES.update({
    "long_tails_d64": (2, 4, 2, 300, 333, 64, 64, {}, 1),
    "causal_d128_tails": (1, 4, 4, 257, 391, 128, 128, {"causal": True}, 1),
    "window_d96": (1, 2, 1, 200, 200, 96, 80, {"window_size": (37, 5)}, 1),
    "split_kv_causal": (1, 2, 1, 9, 400, 64, 64, {"causal": True}, 3),
    "decode_split_kv": (2, 2, 1, 1, 1000, 128, 128, {}, 4),
})


def problem(B, H, Hk, Nq, Nk, D, Dv, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = rules.ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return tuple(rng.standard_normal(s).astype(np.float32).astype(dt)
                 for s in ((B, H, Nq, D), (B, Hk, Nk, D), (B, Hk, Nk, Dv)))


def part_check():
    for step, dtype in STEP_DTYPES:
        for name, (B, H, Hk, Nq, Nk, D, Dv, options, splits) in CASES.items():
            q, k, v = problem(B, H, Hk, Nq, Nk, D, Dv, dtype)
            opts = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
            def go():
                out, lse = tc.attention(q, k, v, step=step, splits=splits, return_lse=True, **opts)
                assert out.dtype == q.dtype, f"out is {out.dtype}, not the input's {q.dtype}"
                checks.check_attention(out, q, k, v, lse=lse, **opts)
                if name == "empty_rows":
                    assert np.isneginf(lse[:, :, Nk:]).all() and (out[:, :, Nk:] == 0).all()
            result = bench.verdict(go)
            bench.log(f"check {step} {dtype} {name}: {result}")
            OUT.write({"benchmark": "gpu_mma_check", "impl": f"cuda_{step}", "dtype": dtype, "case": name,
                       "shape": [B, H, Hk, Nq, Nk, D, Dv], "options": options, "splits": splits, "verdict": result})


def part_resources():
    for kind, D in (("f16", 64), ("f16", 128), ("bf16", 128), ("tf32x1", 64), ("tf32x3", 64), ("tf32x3", 128)):
        step = {"f16": "mma_f16", "bf16": "mma_f16", "tf32x1": "mma_tf32", "tf32x3": "mma_3xtf32"}[kind]
        dtype = {"f16": "float16", "bf16": "bfloat16"}.get(kind, "float32")
        q, k, v = problem(1, 2, 2, 128, 128, D, D, dtype)
        tc.attention(q, k, v, step=step)
        tiling = tc.default_tiling(kind, D, D)
        kernel = tc.make_mma_kernel(kind, tiling, D, D)
        one = lambda values: list(values.values())[0] if isinstance(values, dict) else values
        rec = {"benchmark": "gpu_mma_resources", "impl": f"cuda_{step}", "kind": kind, "D": D,
               "tiling": {"warps": tiling.warps, "Bc": tiling.Bc, "Br": tiling.Br},
               "registers": one(kernel.get_regs_per_thread()), "local_bytes": one(kernel.get_local_mem_per_thread()),
               "shared_bytes": one(kernel.get_shared_mem_per_block())}
        bench.log(rec)
        OUT.write(rec)


def flops(B, H, Nq, Nk, D, causal):
    pairs = Nq * Nk if not causal else sum(min(Nk, Nk - Nq + i + 1) for i in range(Nq))
    return 4.0 * B * H * pairs * D


def mma_call(step, q, k, v, splits=1, tiling=None, **options):
    """A zero-argument callable launching ``step`` on device copies of q, k, v (the conversion outside)."""
    got = {}
    tiling = tiling or TUNED_RUN.get((step, q.shape[-1]))

    def grab(q, k, v, opts, mask):
        got["go"] = tc.launcher(step, q, k, v, opts, mask, splits=splits, tiling=tiling)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v, **options)
    go, out, lse = got["go"]
    return go, out, lse


def timed(label, fn, shape, dtype, causal, what, extra=None):
    fn()
    median, times = bench.cuda_time_it(fn, REPEATS, warmup=3)
    B, H, Nq, Nk, D = shape
    rec = {"benchmark": label, "impl": what[0], "runs_on": what[1], "dtype": dtype, "causal": causal,
           "shape": list(shape), "B": B, "H": H, "Nq": Nq, "Nk": Nk, "D": D, "median_s": median,
           "times_ms": times, "flops": flops(B, H, Nq, Nk, D, causal), "layer": "kernel",
           "tflops": flops(B, H, Nq, Nk, D, causal) / median / 1e12, **(extra or {})}
    bench.log(f"{label} {what[0]:24s} {dtype:9s} causal={causal} {shape}: {median * 1e3:8.3f} ms "
        f"{rec['tflops']:7.1f} TFLOP/s")
    OUT.write(rec)
    return median


def torch_inputs(q, k, v, dtype):
    import torch
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    return tuple(torch.from_numpy(np.asarray(x, np.float32)).to("cuda", dt) for x in (q, k, v))


def peers(q, k, v, dtype, causal, names):
    from course_lib.bench.peers import torch_calls
    calls = torch_calls(*torch_inputs(q, k, v, dtype), causal)
    return {n: calls[n] for n in names}


TIME_HALVES = ("float16", "bfloat16")
TIME_TF32 = (("mma_3xtf32", "mma.sync m16n8k8 tf32, 3 products"),
             ("mma_tf32", "mma.sync m16n8k8 tf32, 1 product (not float32-accurate)"))
if "--tuned-only" in sys.argv:    # the tuned run: the steps the variants part tunes, nothing else
    sys.argv.remove("--tuned-only")
    TIME_HALVES, TIME_TF32 = ("float16",), TIME_TF32[:1]


def part_time(shapes=((4, 16, 4096, 4096, 64), (4, 16, 4096, 4096, 128))):
    import gpu_steps
    for shape in shapes:
        B, H, Nq, Nk, D = shape
        for causal in (False, True):
            q, k, v = problem(B, H, H, Nq, Nk, D, D, "float32", seed=1)
            for dtype in TIME_HALVES:
                qh, kh, vh = (x.astype(rules.ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
                              for x in (q, k, v))
                go = mma_call("mma_f16", qh, kh, vh, causal=causal)[0]
                timed("gpu_mma_time", go, shape, dtype, causal, ("cuda_mma_f16", "mma.sync m16n8k16, fp32 accumulation"))
                for n, fn in peers(q, k, v, dtype, causal, ["torch_sdpa_flash", "torch_sdpa_cudnn"]).items():
                    timed("gpu_mma_time", fn, shape, dtype, causal, (n, peer_runs_on(n, dtype)))
            for step, runs in TIME_TF32:
                go = mma_call(step, q, k, v, causal=causal)[0]
                timed("gpu_mma_time", go, shape, "float32", causal, (f"cuda_{step}", runs))
            gp = gpu_steps.Problem(B, H, Nq, Nk, D, seed=1)
            fn = gp.call("tuned", causal=causal)[1]
            timed("gpu_mma_time", fn, shape, "float32", causal, ("cuda_tuned", "SIMT fp32 (chapter 10)"))
            import torch
            torch.backends.cuda.matmul.allow_tf32 = False
            for n, fn in peers(q, k, v, "float32", causal, ["torch_sdpa_efficient", "torch_naive"]).items():
                timed("gpu_mma_time", fn, shape, "float32", causal, (n, peer_runs_on(n, "float32")))


def part_causal():
    shape = (2, 16, 8192, 8192, 128)
    q, k, v = problem(2, 16, 16, 8192, 8192, 128, 128, "float16", seed=2)
    for D in (64, 128):
        sh = (*shape[:4], D)
        qd, kd, vd = q[..., :D], k[..., :D], v[..., :D]
        for causal in (False, True):
            go = mma_call("mma_f16", qd, kd, vd, causal=causal)[0]
            timed("gpu_mma_causal", go, sh, "float16", causal, ("cuda_mma_f16", "mma.sync m16n8k16"))
            for n, fn in peers(qd, kd, vd, "float16", causal, ["torch_sdpa_flash"]).items():
                timed("gpu_mma_causal", fn, sh, "float16", causal, (n, peer_runs_on(n, "float16")))


def part_decode():
    """Splits swept for the decode tiling (one warp a block, what ``plan`` takes at <= 16 query rows) and for
    the prefill tiling, each row saying whether it is ``tc.decode_splits``' choice, beside FA2 and cuDNN."""
    B, H, Nk, D = 8, 16, 32768, 128
    q, k, v = problem(B, H, H, 1, Nk, D, D, "float16", seed=3)
    kind = tc.kind_of("mma_f16", q.dtype)
    for label, tiling in (("decode", tc.decode_tiling(kind, D, D)), ("prefill", tc.default_tiling(kind, D, D))):
        chosen = tc.decode_splits("mma_f16", q.dtype, B, H, 1, Nk, D, D, tiling=tiling)[0]
        for splits in sorted({1, 4, 8, 16, 32, 64, chosen}):
            go = mma_call("mma_f16", q, k, v, splits=splits, tiling=tiling)[0]
            timed("gpu_mma_decode", go, (B, H, 1, Nk, D), "float16", False, ("cuda_mma_f16", "mma.sync m16n8k16"),
                  {"splits": splits, "tiling_name": label, "tiling": tdict_of(tiling), "chosen": splits == chosen})
    for n, fn in peers(q, k, v, "float16", False, ["torch_sdpa_flash", "torch_sdpa_cudnn"]).items():
        timed("gpu_mma_decode", fn, (B, H, 1, Nk, D), "float16", False, (n, peer_runs_on(n, "float16")))


def part_sanitize():
    """A few small launches of each kernel, for compute-sanitizer (memcheck, racecheck, synccheck)."""
    for step, dtype in (("mma_f16", "float16"), ("mma_3xtf32", "float32")):
        for name in ("long_tails_d64", "softcap_alibi_causal_top_left", "split_kv_causal"):
            B, H, Hk, Nq, Nk, D, Dv, options, splits = CASES[name]
            q, k, v = problem(B, H, Hk, Nq, Nk, D, Dv, dtype)
            opts = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
            for label, tiling in chain(tc.kind_of(step, q.dtype), D, Dv):
                out, lse = tc.attention(q, k, v, step=step, tiling=tiling, splits=splits, return_lse=True, **opts)
                checks.check_attention(out, q, k, v, lse=lse, **opts)
                bench.log(f"sanitize {step} {label} {name}: ran")


RUN_FLAGS = [f for f in ("--staged-only",) if f in sys.argv]
for _f in RUN_FLAGS:
    sys.argv.remove(_f)
TUNED_RUN = {}    # (step, D) -> the tiling the variants part measured fastest (this run's autotune)
TUNE_CHECK = {64: "long_tails_d64", 128: "causal_d128_tails"}


def variants_of(kind, D):
    """The tilings tried: the default and one change each (loads staged or not, the next tile prefetched,
    8 warps instead of 4, fewer keys a tile: fewer registers)."""
    from dataclasses import replace
    base = tc.staged_tiling(kind, D, D)
    out = [] if "--staged-only" in RUN_FLAGS else [replace(base, staged=False, prefetch=False),
                                                     replace(base, staged=True, prefetch=True)]
    for warps in (4, 8):
        for Bc in sorted({base.Bc, base.Bc // 2}, reverse=True):
            t = tc.MmaTiling(warps, Bc, staged=True, prefetch=False)
            if t not in out and tc.shared_bytes(kind, t, D, D) <= 48 * 1024:
                out.append(t)
    return out


def part_variants():
    """Each tiling checked (check_attention at an awkward shape of the same head dim, and against the first
    tiling's output at the timed shape), then timed; the fastest per (step, D) is this run's choice."""
    for D in (64, 128):
        shape = (4, 16, 4096, 4096, D)
        q, k, v = problem(4, 16, 16, 4096, 4096, D, D, "float32", seed=1)
        for step, dtype in (("mma_f16", "float16"), ("mma_3xtf32", "float32")):
            x = tuple(a.astype(np.float16) if dtype == "float16" else a for a in (q, k, v))
            kind = tc.kind_of(step, x[0].dtype)
            ref, best = None, None
            for tiling in variants_of(kind, D):
                tdict = {"warps": tiling.warps, "Bc": tiling.Bc, "staged": tiling.staged, "prefetch": tiling.prefetch}
                try:
                    B, H, Hk, Nq, Nk, Dc, Dvc, options, splits = CASES[TUNE_CHECK[D]]
                    qc, kc, vc = problem(B, H, Hk, Nq, Nk, Dc, Dvc, dtype)
                    out, lse = tc.attention(qc, kc, vc, step=step, tiling=tiling, return_lse=True, **options)
                    checks.check_attention(out, qc, kc, vc, lse=lse, **options)
                    go, out, _ = mma_call(step, *x, tiling=tiling)
                    go()
                    got = out.copy_to_host()
                    ref = got if ref is None else ref
                    same = float(np.max(np.abs(got - ref)))
                    t = timed("gpu_mma_variants", go, shape, dtype, False, (f"cuda_{step}", "mma.sync"),
                              {"tiling": tdict, "max_diff_to_first": same, "check": f"PASS {TUNE_CHECK[D]}"})
                    if same <= 1e-3 and (best is None or t < best[0]):
                        best = (t, tiling)
                except Exception as error:  # noqa: BLE001
                    bench.log(f"variant {step} D={D} {tiling}: {type(error).__name__}: {str(error)[:300]}")
                    OUT.write({"benchmark": "gpu_mma_variants", "impl": f"cuda_{step}", "D": D, "tiling": tdict,
                               "error": f"{type(error).__name__}: {str(error)[:500]}"})
            if best is not None:
                TUNED_RUN[step, D] = best[1]
                OUT.write({"benchmark": "gpu_mma_tuned", "impl": f"cuda_{step}", "D": D,
                           "tiling": {"warps": best[1].warps, "Bc": best[1].Bc, "staged": best[1].staged,
                                      "prefetch": best[1].prefetch}, "median_s": best[0]})


def chain(kind, D, Dv=None):
    """(name, tiling) of the chain's steps at head dim D: the tuned tiling, then ldmatrix, then cp.async; for
    3xTF32 then each A fragment split once (e); then Q's fragments in shared memory (f; 3xTF32's split once)."""
    from dataclasses import replace
    base = tc.staged_tiling(kind, D, D if Dv is None else Dv)
    ld = replace(base, staged=True, prefetch=False, ldmatrix=True)
    steps = [("staged", base), ("ldmatrix", ld), ("cp_async", replace(ld, stages=2))]
    if kind == "tf32x3":
        steps += [("split_once", replace(ld, stages=2, split_once=True)),
                  ("q_shared", replace(ld, stages=2, split_once=True, q_shared=True))]
    else:
        steps.append(("q_shared", replace(ld, stages=2, q_shared=True)))
    return steps


def tdict_of(t):
    return {"warps": t.warps, "Bc": t.Bc, "staged": t.staged, "prefetch": t.prefetch, "ldmatrix": t.ldmatrix,
            "stages": t.stages, "split_once": t.split_once, "q_shared": t.q_shared}


CHAIN = {"cases": None, "timed": None, "steps": None, "labels": None, "timing_only": False}   # main's --chain-* options


def part_chain():
    from dataclasses import replace
    checked = () if CHAIN["timing_only"] else (("mma_f16", "float16"), ("mma_3xtf32", "float32"))
    for step, dtype in [(s, d) for s, d in checked if CHAIN["steps"] is None or s in CHAIN["steps"]]:
        for name, (B, H, Hk, Nq, Nk, D, Dv, options, splits) in CASES.items():
            if CHAIN["cases"] is not None and name not in CHAIN["cases"]:
                continue
            q, k, v = problem(B, H, Hk, Nq, Nk, D, Dv, dtype)
            opts = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
            kind = tc.kind_of(step, q.dtype)
            for label, tiling in chain(kind, D, Dv)[1:]:
                if CHAIN["labels"] is not None and label not in CHAIN["labels"]:
                    continue

                def go():
                    out, lse = tc.attention(q, k, v, step=step, tiling=tiling, splits=splits, return_lse=True, **opts)
                    checks.check_attention(out, q, k, v, lse=lse, **opts)
                result = bench.verdict(go)
                bench.log(f"chain check {step} {label} {name}: {result}")
                OUT.write({"benchmark": "gpu_mma_chain_check", "impl": f"cuda_{step}", "dtype": dtype, "case": name,
                           "step": label, "tiling": tdict_of(tiling), "shape": [B, H, Hk, Nq, Nk, D, Dv],
                           "options": options, "splits": splits, "verdict": result})
    for D in (64, 128):
        shape = (4, 16, 4096, 4096, D)
        q, k, v = problem(4, 16, 16, 4096, 4096, D, D, "float32", seed=1)
        for step, dtype, peer in (("mma_f16", "float16", "torch_sdpa_flash"),
                                  ("mma_3xtf32", "float32", "torch_sdpa_efficient")):
            if CHAIN["timed"] is not None and f"{step}:{D}" not in CHAIN["timed"]:
                continue
            x = tuple(a.astype(np.float16) if dtype == "float16" else a for a in (q, k, v))
            kind = tc.kind_of(step, x[0].dtype)
            steps = chain(kind, D)
            last_label, last = steps[-1]
            for warps in (4, 8):
                for Bc in (32, 64):
                    t = replace(last, warps=warps, Bc=Bc)
                    if t != last and tc.shared_bytes(kind, t, D, D) <= tc.MAX_SHARED:
                        steps.append((f"{last_label}_sweep", t))
            ref, best = None, None
            for label, tiling in steps:
                try:
                    go, out, _ = mma_call(step, *x, tiling=tiling)
                    go()
                    got = out.copy_to_host()
                    ref = got if ref is None else ref
                    same = float(np.max(np.abs(got - ref)))
                    t = timed("gpu_mma_chain", go, shape, dtype, False, (f"cuda_{step}", "mma.sync"),
                              {"step": label, "tiling": tdict_of(tiling), "max_diff_to_first": same})
                    if label != "staged" and same <= 1e-3 and (best is None or t < best[0]):
                        best = (t, tiling)
                except Exception as error:  # noqa: BLE001
                    bench.log(f"chain {step} D={D} {label} {tiling}: {type(error).__name__}: {str(error)[:300]}")
                    OUT.write({"benchmark": "gpu_mma_chain", "impl": f"cuda_{step}", "D": D, "step": label,
                               "tiling": tdict_of(tiling), "error": f"{type(error).__name__}: {str(error)[:500]}"})
            import torch
            torch.backends.cuda.matmul.allow_tf32 = False
            for n, fn in peers(q, k, v, dtype, False, [peer]).items():
                timed("gpu_mma_chain", fn, shape, dtype, False, (n, peer_runs_on(n, dtype)))
            if best is not None:
                TUNED_RUN[step, D] = best[1]
                OUT.write({"benchmark": "gpu_mma_chain_tuned", "impl": f"cuda_{step}", "D": D,
                           "tiling": tdict_of(best[1]), "median_s": best[0]})


def part_split_sweep():
    """3xTF32's steps (e) split_once and (f) q_shared (both checked by the chain part), their warps and key tile
    swept at B*H = 64, N = 4096, D = 64 / 128 beside SDPA efficient; each output compared with (d)'s."""
    from dataclasses import replace

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    for D in (64, 128):
        shape = (4, 16, 4096, 4096, D)
        q, k, v = problem(4, 16, 16, 4096, 4096, D, D, "float32", seed=1)
        base = replace(tc.default_tiling("tf32x3", D, D), stages=2, ldmatrix=True)
        go, out, _ = mma_call("mma_3xtf32", q, k, v, tiling=base)
        go()
        ref = out.copy_to_host()
        timed("gpu_mma_split_sweep", go, shape, "float32", False, ("cuda_mma_3xtf32", "mma.sync"),
              {"step": "cp_async", "tiling": tdict_of(base)})
        for label, flags in (("split_once", {"split_once": True}), ("q_shared", {"split_once": True, "q_shared": True})):
            for warps in (4, 8):
                for Bc in (16, 32, 64):
                    t = replace(base, warps=warps, Bc=Bc, **flags)
                    if tc.shared_bytes("tf32x3", t, D, D) > tc.MAX_SHARED or (label == "q_shared" and Bc == 16):
                        continue
                    try:
                        go, out, _ = mma_call("mma_3xtf32", q, k, v, tiling=t)
                        go()
                        same = float(np.max(np.abs(out.copy_to_host() - ref)))
                        timed("gpu_mma_split_sweep", go, shape, "float32", False, ("cuda_mma_3xtf32", "mma.sync"),
                              {"step": label, "tiling": tdict_of(t), "max_diff_to_cp_async": same})
                    except Exception as error:  # noqa: BLE001
                        OUT.write({"benchmark": "gpu_mma_split_sweep", "impl": "cuda_mma_3xtf32", "D": D, "step": label,
                                   "tiling": tdict_of(t), "error": f"{type(error).__name__}: {str(error)[:300]}"})
        for n, fn in peers(q, k, v, "float32", False, ["torch_sdpa_efficient"]).items():
            timed("gpu_mma_split_sweep", fn, shape, "float32", False, (n, peer_runs_on(n, "float32")))


PARTS = {"check": part_check, "resources": part_resources, "time": part_time, "causal": part_causal,
         "decode": part_decode, "variants": part_variants, "sanitize": part_sanitize, "chain": part_chain,
         "split_sweep": part_split_sweep}


def main():
    global OUT, RUN, ENV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=[p for p in PARTS if p not in ("sanitize", "chain", "split_sweep")],
                        choices=list(PARTS))
    parser.add_argument("--chain-cases", nargs="+", default=None, choices=list(CASES),
                        help="the chain part checks these cases only (default: every case)")
    parser.add_argument("--chain-timed", nargs="+", default=None, metavar="STEP:D",
                        help="the chain part times these (step, head dim) only, e.g. mma_3xtf32:64")
    parser.add_argument("--chain-steps", nargs="+", default=None, choices=("mma_f16", "mma_3xtf32"),
                        help="the chain part checks these steps only (default: both)")
    parser.add_argument("--chain-labels", nargs="+", default=None,
                        choices=("ldmatrix", "cp_async", "split_once", "q_shared"),
                        help="the chain part checks these of its steps only (default: every step)")
    parser.add_argument("--chain-timing-only", action="store_true", help="the chain part checks nothing")
    args = parser.parse_args()
    CHAIN.update(cases=args.chain_cases, timed=args.chain_timed, steps=args.chain_steps, labels=args.chain_labels,
                 timing_only=args.chain_timing_only)
    RUN, ENV = bench.new_run(), bench.gpu_environment()
    with bench.RecordFile(args.out, run=RUN, run_id=RUN, environment=ENV) as OUT:
        for part in args.parts:
            t0 = time.time()
            try:
                PARTS[part]()
            except Exception:  # noqa: BLE001
                bench.log(f"part {part} failed:\n{traceback.format_exc()}")
                OUT.write({"benchmark": f"gpu_mma_{part}", "error": traceback.format_exc()[-2000:]})
            bench.log(f"part {part}: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
