"""The backward pass on this CPU: the course's compiled backward against PyTorch's autograd.  (chapter 12)

    .venv/bin/python benchmarks/backward.py                 # time, recompute share, then memory
    .venv/bin/python benchmarks/backward.py --no-memory --rounds 2
    .venv/bin/python benchmarks/backward.py --no-time --no-gemm --no-memory --tiles 128x256 256x512

Appends to ``notebooks/records/backward.jsonl``, where chapter 12 plots it:

- ``backward_time``: at (1, 8, 4096, D) for D = 64 and 128, causal or not,
  float32, the backward alone (out, lse and dout made beforehand): the course's
  ``flash_numba_cpu`` (dQ by per-thread partials, its default tiles
  ``backward_numba_cpu.TILES`` for the mask), ``flash_numba_cpu_dq_pass``
  (dQ by a second pass) and ``torch_sdpa`` (``out.backward(dout)`` through
  ``scaled_dot_product_attention``, the graph kept between calls).  Every
  measurement is a worker process of its own, and the rounds alternate the
  impls, so that a load that comes and goes on a shared machine hits them alike;
  each record keeps min, median and max over the rounds, and the load average
  (``os.getloadavg``) before and after the timing: others' work on a shared machine.
- ``backward_recompute``: in the same workers, the recompute alone
  (``backward_numba_cpu.recompute_only``: S = Q K^T and P = exp(S - lse) on
  every tile the backward visits) beside the full backward: its share of the time.
- ``backward_tiles``: the course's ``flash_numba_cpu`` at the same shapes
  with other tiles (Br x Bc), alternated over rounds in workers of their
  own: the sweep ``backward_numba_cpu.TILES`` was chosen from, each record
  with its ratio to the median of the mask's default tiles in the same run.
- ``backward_tile_gemm``: what holds the kernel back, measured: the rate of
  the backward's five tile matmuls (S = Q K^T, dP = dO V^T, then dV += P^T dO,
  dK += dS^T Q, dQ += dS K, accumulating) at the kernel's tiles without a
  mask, on one core, through the BLAS each side calls: SciPy's OpenBLAS by
  ``np.dot`` and ``blas_add.dot_add`` inside njit (the course's kernel) and
  PyTorch's MKL by ``torch.mm`` and ``addmm_`` (its backward's), in
  alternated worker processes.
- ``backward_phases``: where one core's time goes, phase by phase, in the
  kernel's own tile functions at its tiles without a mask, over one head of
  (4096, D): S^T = K Q'^T, dP^T = V dO^T (``np.dot``), P^T = exp(S^T - lse)
  (the exponentials, ``scores_to_pt``), dS^T (``pt_to_dst``), then dV, dK,
  dQ (``dot_add``); each matmul's GFLOP/s beside a large sgemm's (2048^3) on
  the same core, the best this BLAS does here.  Two records per D: the
  kernel's tile, a row per key (``tile_rows`` "keys", ``kernel`` true), and
  the same tile a row per query ("queries": S = Q'K^T, ``scores_to_p``,
  ``p_to_ds``), where dV += P^T dO and dK += dS^T Q' take a transposed tile:
  the measurement the kernel's orientation was chosen by, alternated in one
  worker.
- ``backward_memory``: B = H = 1, D = 64, N from 1K to 16K: how far the
  resident set rises during one backward call above where it stood with q, k,
  v, out, lse and dout made (Linux's peak-RSS counter, reset first).  The
  tiled backwards hold O(N) (dQ accumulators, D, tiles); ``naive`` materialises
  P, dP and dS, O(N^2), and is not run where they would not fit.

A benchmark, not a test: nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "backward.jsonl"
TIME_IMPLS = ("flash_numba_cpu", "flash_numba_cpu_dq_pass", "torch_sdpa")
MEMORY_IMPLS = ("flash_numba_cpu", "flash_numba_cpu_dq_pass", "flash_numpy", "naive", "torch_sdpa")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)}   # large blocks stay visible in the RSS


def resident_bytes(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def problem(B, H, N, D, causal, seed=0):
    import course_lib
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, N, D)).astype(np.float32) for _ in range(3))
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=causal, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    return q, k, v, out, lse, dout


def make_call(impl, q, k, v, out, lse, dout, causal, tiles=(None, None)):
    """A zero-argument callable running one backward of ``impl`` (at tiles (Br, Bc), None: its default)."""
    if impl == "torch_sdpa":
        import torch
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        tdout = torch.from_numpy(dout)

        def call():
            for t in (tq, tk, tv):
                t.grad = None
            tout.backward(tdout, retain_graph=True)
        return call
    import course_lib
    Br, Bc = tiles
    return lambda: course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, causal=causal,
                                                 block_q=Br, block_k=Bc)


def tile_gemm_rate(blas, D, repeats=200):
    """GFLOP/s of the five tile matmuls of one backward step on one core, best of 5 runs of ``repeats``."""
    from course_lib.kernels.backward_numba_cpu import TILES
    Br, Bc = TILES["full"]
    rng = np.random.default_rng(0)
    Q, dO = (rng.standard_normal((Br, D)).astype(np.float32) for _ in range(2))
    K, V = (rng.standard_normal((Bc, D)).astype(np.float32) for _ in range(2))
    S, dP = np.zeros((Br, Bc), np.float32), np.zeros((Br, Bc), np.float32)
    dV, dK, dQ = np.zeros((Bc, D), np.float32), np.zeros((Bc, D), np.float32), np.zeros((Br, D), np.float32)
    if blas == "torch_mkl":
        import torch
        torch.set_num_threads(1)
        Q, dO, K, V, S, dP, dV, dK, dQ = (torch.from_numpy(x) for x in (Q, dO, K, V, S, dP, dV, dK, dQ))

        def run(n):
            for _ in range(n):
                torch.mm(Q, K.t(), out=S)
                torch.mm(dO, V.t(), out=dP)
                dV.addmm_(S.t(), dO)
                dK.addmm_(dP.t(), Q)
                dQ.addmm_(dP, K)
    else:
        import numba

        from course_lib.kernels.blas_add import dot_add
        from course_lib.kernels.cpu_steps import scipy_openblas
        library = scipy_openblas()
        if library is not None:
            library.scipy_openblas_set_num_threads(1)

        @numba.njit
        def five(Q, K, dO, V, S, dP, dV, dK, dQ, n):
            for _ in range(n):
                np.dot(Q, K.T, S)
                np.dot(dO, V.T, dP)
                dot_add(S.T, dO, dV)
                dot_add(dP.T, Q, dK)
                dot_add(dP, K, dQ)

        def run(n):
            five(Q, K, dO, V, S, dP, dV, dK, dQ, n)
    run(2)
    best = np.inf
    for _ in range(5):
        start = time.perf_counter()
        run(repeats)
        best = min(best, time.perf_counter() - start)
    return 10 * Br * Bc * D * repeats / best / 1e9


# The kernel's phases, its tile transposed (a row per key, ``tile_rows`` "keys"), and those of the
# kernel before it (a row per query, "queries": two of its accumulating matmuls took a transposed tile).
PHASES = {"keys": ("S^T = K Q'^T", "dP^T = V dO^T", "P^T = exp(S^T - lse)", "dS^T = P^T (dP^T - D)",
                   "dV += P^T dO", "dK += dS^T Q'", "dQ += (dS^T)^T K"),
          "queries": ("S = Q'K^T", "dP = dO V^T", "P = exp(S - lse)", "dS = P (dP - D)", "dV += P^T dO",
                      "dK += dS^T Q'", "dQ += dS K")}
MATMUL_PHASES = (0, 1, 4, 5, 6)


def phase_times(N, D, repeats=3):
    """Seconds of each of ``PHASES``' phases over one head of (N, D) on one core (best of ``repeats``), for
    each tile orientation (a dict), and the GFLOP/s of a 2048^3 sgemm through the same BLAS."""
    import numba

    from course_lib.core import rules
    from course_lib.kernels import backward_numba_cpu as kernel
    from course_lib.kernels.blas_add import dot_add
    from course_lib.kernels.cpu_steps import scipy_openblas
    library = scipy_openblas()
    if library is not None:
        library.scipy_openblas_set_num_threads(1)
    numba.set_num_threads(1)
    Br, Bc = kernel.TILES["full"]
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((1, 1, N, D)).astype(np.float32) for _ in range(4))
    q *= np.float32(D ** -0.5)
    lse = (np.log(N) + 0.1 * rng.standard_normal((1, 1, N))).astype(np.float32)
    Dsum = rng.standard_normal((1, 1, N)).astype(np.float32)

    @numba.njit
    def phase(which, q, k, v, dout, lse, Dsum, Br, Bc):
        N, D = q.shape[2], q.shape[3]
        P, dS, G = np.empty((Br, Bc), np.float32), np.empty((Br, Bc), np.float32), np.ones((Br, Bc), np.float32)
        PT, dST, GT = np.empty((Bc, Br), np.float32), np.empty((Bc, Br), np.float32), np.ones((Bc, Br), np.float32)
        dVj, dKj, dq = np.zeros((Bc, D), np.float32), np.zeros((Bc, D), np.float32), np.zeros((N, D), np.float32)
        bits, shifts = np.empty(max(Br, Bc), np.int32), np.empty(Br, np.float32)
        np.dot(q[0, 0, :Br], k[0, 0, :Bc].T, P)
        np.dot(dout[0, 0, :Br], v[0, 0, :Bc].T, dS)
        kernel.scores_to_p(P, G, lse, 0, 0, 0, 0, rules.FULL, np.float32(0), False, 0.0, 0, -1, -1, True, bits)
        np.dot(k[0, 0, :Bc], q[0, 0, :Br].T, PT)
        np.dot(v[0, 0, :Bc], dout[0, 0, :Br].T, dST)
        kernel.scores_to_pt(PT, GT, lse, 0, 0, 0, 0, rules.FULL, np.float32(0), False, 0.0, 0, -1, -1, True, bits,
                            shifts)
        for c0 in range(0, N, Bc):
            Kj, Vj = k[0, 0, c0:c0 + Bc], v[0, 0, c0:c0 + Bc]
            for r0 in range(0, N, Br):
                Qi, dOi = q[0, 0, r0:r0 + Br], dout[0, 0, r0:r0 + Br]
                if which == 0:
                    np.dot(Qi, Kj.T, P)
                elif which == 1:
                    np.dot(dOi, Vj.T, dS)
                elif which == 2:     # S again, then P from it (S's time is taken off below)
                    np.dot(Qi, Kj.T, P)
                    kernel.scores_to_p(P, G, lse, 0, 0, r0, c0, rules.FULL, np.float32(0), False, 0.0, 0, -1, -1,
                                       True, bits)
                elif which == 3:     # dP again, then dS from it
                    np.dot(dOi, Vj.T, dS)
                    kernel.p_to_ds(P, dS, G, Dsum, 0, 0, r0, np.float32(0), 0, 0)
                elif which == 4:
                    dot_add(P.T, dOi, dVj)
                elif which == 5:
                    dot_add(dS.T, Qi, dKj)
                elif which == 6:
                    dot_add(dS, Kj, dq[r0:r0 + Br])
                elif which == 7:     # the kernel's: the tile transposed
                    np.dot(Kj, Qi.T, PT)
                elif which == 8:
                    np.dot(Vj, dOi.T, dST)
                elif which == 9:
                    np.dot(Kj, Qi.T, PT)
                    kernel.scores_to_pt(PT, GT, lse, 0, 0, r0, c0, rules.FULL, np.float32(0), False, 0.0, 0, -1, -1,
                                        True, bits, shifts)
                elif which == 10:
                    np.dot(Vj, dOi.T, dST)
                    kernel.pt_to_dst(PT, dST, GT, Dsum, 0, 0, r0, np.float32(0), 0, 0)
                elif which == 11:
                    dot_add(PT, dOi, dVj)
                elif which == 12:
                    dot_add(dST, Qi, dKj)
                else:
                    dot_add(dST.T, Kj, dq[r0:r0 + Br])
        return dVj.sum() + dKj.sum() + dq.sum()

    @numba.njit
    def sgemm(a, out, n):
        for _ in range(n):
            np.dot(a, a, out)

    seconds = {}
    for first, rows in ((0, "queries"), (7, "keys")):
        for which in range(first, first + 7):
            phase(which, q, k, v, dout, lse, Dsum, Br, Bc)
        seconds[rows] = []
    for _ in range(repeats):                 # the orientations alternate, so that a load hits both alike
        for first, rows in ((0, "queries"), (7, "keys")):
            for which in range(first, first + 7):
                start = time.perf_counter()
                phase(which, q, k, v, dout, lse, Dsum, Br, Bc)
                seconds[rows].append(time.perf_counter() - start)
    for rows in seconds:
        seconds[rows] = list(np.array(seconds[rows]).reshape(repeats, 7).min(axis=0))
        seconds[rows][2] -= seconds[rows][0]         # the exponentials alone
        seconds[rows][3] -= seconds[rows][1]         # the dS pass alone
    a = np.ones((2048, 2048), np.float32)
    out = np.empty_like(a)
    sgemm(a, out, 1)
    start = time.perf_counter()
    sgemm(a, out, 5)
    return seconds, 5 * 2 * 2048 ** 3 / (time.perf_counter() - start) / 1e9


def worker(impl, shape, causal, what):
    """One impl, one shape, in this process; prints one JSON line."""
    B, H, N, D = shape
    if what == "gemm":
        print(json.dumps({"gflops": tile_gemm_rate(impl, D)}))
        return
    if what == "phases":
        seconds, sgemm = phase_times(N, D)
        print(json.dumps({"seconds": seconds, "sgemm_gflops": sgemm}))
        return
    tiles = (None, None)
    if what.startswith("tiles="):                           # "tiles=256x512": time at those tiles
        tiles = tuple(int(n) for n in what[len("tiles="):].split("x"))
    small = problem(1, 2, 128, D, causal)
    make_call(impl, *small, causal, tiles)()                # compile / load the cache, warm up
    arrays = problem(B, H, N, D, causal)
    call = make_call(impl, *arrays, causal, tiles)
    result = {}
    if what == "memory":
        before = resident_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")       # reset the peak-RSS counter (VmHWM)
        start = time.perf_counter()
        call()
        result["time_s"] = time.perf_counter() - start
        result["peak_bytes"] = resident_bytes("VmHWM") - before
    else:
        start = time.perf_counter()
        call()
        result["time_s"] = time.perf_counter() - start
        if impl == "flash_numba_cpu" and what == "time":
            from course_lib.core.backward_options import call_backward
            from course_lib.kernels.backward_numba_cpu import recompute_only
            call_backward(recompute_only, *small, causal=causal)  # compile
            start = time.perf_counter()
            call_backward(recompute_only, *arrays, causal=causal)
            result["recompute_s"] = time.perf_counter() - start
    print(json.dumps(result))


def run_worker(args):
    out = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True,
                         check=False, env={**os.environ, **MALLOC_ENV})
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=4, metavar=("IMPL", "SHAPE", "CAUSAL", "WHAT"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--memory-sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--naive-budget-gib", type=float, default=6.0)
    parser.add_argument("--tiles", nargs="*", default=[], metavar="BRxBC",
                        help="also time flash_numba_cpu at these tiles (and the default's), alternated")
    parser.add_argument("--phases", action="store_true", help="also time the kernel's phases on one core")
    parser.add_argument("--no-time", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-gemm", action="store_true")
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    if args.worker:
        impl, shape, causal, what = args.worker
        return worker(impl, tuple(int(n) for n in shape.split(",")), causal == "1", what)

    import numba
    import torch
    from tqdm import tqdm

    from course_lib import bench
    env = bench.environment()
    env.update(torch=torch.__version__, torch_threads=torch.get_num_threads(), numba_threads=numba.get_num_threads())
    run = bench.new_run()
    print(f"run {run} on {env['cpu']} ({env['cpu_cores']['usable']} cores), float32; records -> {args.out}")

    if not args.no_time:
        cases = [(d, causal) for d in args.head_dims for causal in (False, True)]
        times = {(impl, d, c): [] for impl in TIME_IMPLS for d, c in cases}
        recompute = {(d, c): [] for d, c in cases}
        steps = [(r, d, c, impl) for r in range(args.rounds) for d, c in cases
                 for impl in (TIME_IMPLS if r % 2 == 0 else TIME_IMPLS[::-1])]
        load_before = os.getloadavg()
        for _, d, c, impl in tqdm(steps, desc="time", unit="call"):
            result = run_worker([impl, f"1,8,{args.seqlen},{d}", "1" if c else "0", "time"])
            times[impl, d, c].append(result["time_s"])
            if "recompute_s" in result:
                recompute[d, c].append(result["recompute_s"] / result["time_s"])
        load = {"before": list(load_before), "after": list(os.getloadavg())}
        from course_lib.kernels.backward_numba_cpu import TILES
        for (impl, d, c), values in times.items():
            extra = bench.spread(values, "s", every=True)
            extra["load_average"] = load
            if impl != "torch_sdpa":
                extra["block_q"], extra["block_k"] = TILES["masked" if c else "full"]
            torch_median = np.median(times["torch_sdpa", d, c])
            extra["speedup_vs_torch_sdpa"] = float(torch_median / np.median(values))
            if impl == "flash_numba_cpu":
                extra["recompute_share"] = bench.spread(recompute[d, c], "s", every=True)
            bench.append_record(args.out, benchmark="backward_time", impl=impl, shape=(1, 8, args.seqlen,
                                args.seqlen, d), dtype="float32", time_s=float(np.median(values)), causal=c,
                                run=run, env=env, layer="end to end", pass_="backward", **extra)
            share = f", recompute {np.median(recompute[d, c]):.0%}" if impl == "flash_numba_cpu" else ""
            print(f"D={d} causal={c} {impl:<24} median {np.median(values):.3f} s "
                  f"({extra['speedup_vs_torch_sdpa']:.2f}x torch){share}")

    if args.tiles:
        from course_lib.kernels.backward_numba_cpu import TILES
        defaults = {c: "x".join(str(n) for n in TILES["masked" if c else "full"]) for c in (False, True)}
        candidates = list(dict.fromkeys([*defaults.values(), *args.tiles]))
        cases = [(d, causal) for d in args.head_dims for causal in (False, True)]
        steps = [(d, c, t) for r in range(args.rounds) for d, c in cases
                 for t in (candidates if r % 2 == 0 else candidates[::-1])]
        times = {(t, d, c): [] for t in candidates for d, c in cases}
        load_before = os.getloadavg()
        for d, c, t in tqdm(steps, desc="tiles", unit="call"):
            result = run_worker(["flash_numba_cpu", f"1,8,{args.seqlen},{d}", "1" if c else "0", f"tiles={t}"])
            times[t, d, c].append(result["time_s"])
        load = {"before": list(load_before), "after": list(os.getloadavg())}
        for (t, d, c), values in times.items():
            Br, Bc = (int(n) for n in t.split("x"))
            ratio = float(np.median(times[defaults[c], d, c]) / np.median(values))
            bench.append_record(args.out, benchmark="backward_tiles", impl="flash_numba_cpu",
                                shape=(1, 8, args.seqlen, args.seqlen, d), dtype="float32",
                                time_s=float(np.median(values)), causal=c, run=run, env=env, layer="end to end",
                                pass_="backward", block_q=Br, block_k=Bc,
                                default_tiles=[int(n) for n in defaults[c].split("x")],
                                speedup_vs_default_tiles=ratio, load_average=load,
                                **bench.spread(values, "s", every=True))
            print(f"D={d} causal={c} tiles {t:<8} median {np.median(values):.3f} s "
                  f"({ratio:.2f}x the default {defaults[c]})")

    if args.phases:
        from course_lib.kernels.backward_numba_cpu import TILES
        Br, Bc = TILES["full"]
        seconds = {(d, rows): [] for d in args.head_dims for rows in PHASES}
        sgemm = {d: [] for d in args.head_dims}
        load_before = os.getloadavg()
        for _, d in tqdm([(r, d) for r in range(args.rounds) for d in args.head_dims], desc="phases", unit="call"):
            result = run_worker(["flash_numba_cpu", f"1,1,{args.seqlen},{d}", "0", "phases"])
            for rows in PHASES:
                seconds[d, rows].append(result["seconds"][rows])
            sgemm[d].append(result["sgemm_gflops"])
        load = {"before": list(load_before), "after": list(os.getloadavg())}
        for d, rows in seconds:
            per_phase = np.median(np.array(seconds[d, rows]), axis=0)
            matmul_gflops = 2 * args.seqlen ** 2 * d / per_phase / 1e9
            phases = [{"phase": name, "median_s": float(t), **({"gflops": float(g)} if n in MATMUL_PHASES else {})}
                      for n, (name, t, g) in enumerate(zip(PHASES[rows], per_phase, matmul_gflops))]  # kernel's order
            bench.append_record(args.out, benchmark="backward_phases", impl="flash_numba_cpu",
                                shape=(1, 1, args.seqlen, args.seqlen, d), dtype="float32",
                                time_s=float(per_phase.sum()), run=run, env=env, layer="kernel", threads=1,
                                tile_rows=rows, kernel=rows == "keys",
                                block_q=Br, block_k=Bc, phases=phases, rounds=args.rounds, load_average=load,
                                sgemm_2048_gflops=bench.spread(sgemm[d]))
            print(f"D={d} a row per {dict(keys='key', queries='query')[rows]}, one head on one core, {Br} x {Bc} "
                  f"tiles, total {per_phase.sum() * 1e3:.1f} ms, sgemm 2048^3 {np.median(sgemm[d]):.0f} GFLOP/s: "
                  + ", ".join(f"{p['phase']} {1e3 * p['median_s']:.1f} ms" + (f" ({p['gflops']:.0f} GFLOP/s)"
                                                                           if "gflops" in p else "") for p in phases))

    if not args.no_gemm:
        from course_lib.kernels.backward_numba_cpu import TILES
        blases = ("scipy_openblas", "torch_mkl")
        steps = [(d, blas) for r in range(args.rounds) for d in args.head_dims
                 for blas in (blases if r % 2 == 0 else blases[::-1])]
        rates = {(blas, d): [] for d in args.head_dims for blas in blases}
        load_before = os.getloadavg()
        for d, blas in tqdm(steps, desc="tile gemm", unit="call"):
            rates[blas, d].append(run_worker([blas, f"1,1,1,{d}", "0", "gemm"])["gflops"])
        load = {"before": list(load_before), "after": list(os.getloadavg())}
        for (blas, d), values in rates.items():
            Br, Bc = TILES["full"]
            bench.append_record(args.out, benchmark="backward_tile_gemm", impl=blas, shape=(1, 1, Br, Bc, d),
                                dtype="float32", time_s=10 * Br * Bc * d / (np.median(values) * 1e9), run=run,
                                env=env, layer="kernel", block_q=Br, block_k=Bc, load_average=load, threads=1,
                                gflops={**bench.spread(values), "rounds": len(values)})
            print(f"D={d} {blas:<15} five tile matmuls ({Br} x {Bc}) on one core: median {np.median(values):.0f} GFLOP/s")

    if not args.no_memory:
        steps = [(n, impl) for n in args.memory_sizes for impl in MEMORY_IMPLS]
        for n, impl in tqdm(steps, desc="memory", unit="call"):
            if impl == "naive" and 6 * n * n * 4 > args.naive_budget_gib * 2 ** 30:
                bench.append_record(args.out, benchmark="backward_memory", impl=impl, shape=(1, 1, n, n, 64),
                                    dtype="float32", time_s=1.0, run=run, env=env, skipped="P, dP, dS do not fit")
                continue
            if impl == "flash_numpy" and n > 8192:
                continue                                     # minutes of numpy tile calls; the compiled ones show it
            result = run_worker([impl, f"1,1,{n},64", "0", "memory"])
            bench.append_record(args.out, benchmark="backward_memory", impl=impl, shape=(1, 1, n, n, 64),
                                dtype="float32", time_s=result["time_s"], run=run, env=env,
                                peak_bytes=result["peak_bytes"], saved_bytes=4 * n * 64 * 4 + 4 * n)
            print(f"N={n} {impl:<24} peak +{result['peak_bytes'] / 2 ** 20:.1f} MiB")


if __name__ == "__main__":
    main()
