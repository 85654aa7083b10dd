"""The capstone's experiment groups on this machine, and the check behind chapter 16's second post-mortem.

    .venv/bin/python benchmarks/capstone.py                # append one run (about three minutes, 2 cores)
    .venv/bin/python benchmarks/capstone.py --rounds 7

Four groups, each a series of one change at a time (the brief's evaluation method):

- ``bandwidth``: one fixed problem (B=1, H=4, N=1024, D=64, float32, no mask) on the
  native kernel with 1 and with 2 cores: each core count in its own spawned process
  (``NUMBA_NUM_THREADS`` is read once, when numba starts), the processes alternated;
  each process records its first call (compilation from numba's cache and first touch
  of the inputs) apart from the timed ones;
- ``length``: the same problem at N = 256 ... 2048, native and public paths alternated;
  beside the time, the model's HBM bytes (``flash_io``, on the tiles the kernel runs here:
  its L2-sized default for D = 64 in float32, recorded as ``block_q`` / ``block_k``) and
  naive bytes, the tile's working set (``tile_budget``) and the peak memory one native
  call allocated, measured with tracemalloc, beside the bytes S would take: did the
  intermediates stay "on chip" (in the tile buffers)?
- ``mask``: N = 1024, no mask, causal, a window of N/8 and of N/2 keys, with the work
  (FLOPs after skipped tiles) and model bytes of each;
- ``conversion``: why float16 costs the native kernel a multiple of its float32 time.
  Four calls on one problem, alternated: the whole float16 call; the float16 inputs
  converted to float32 alone; the compiled kernel on float32 arrays with float16's
  rounding of P in its inner loop (what the float16 call launches); and the same
  kernel with that rounding off (what a float32 call launches).

(The precision group is the regression matrix's record, ``matrix_cpu.jsonl``.)  One
record per (group, case, path) to ``notebooks/records/capstone_cpu.jsonl``: ``times_ms``
of every round and their ``min_ms`` / ``median_ms`` / ``max_ms``, and the model numbers
named above, and the load average (``os.getloadavg``) before and after the run.  This is a
benchmark, not a test.
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from course_lib import bench

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "capstone_cpu.jsonl"
B, H, D, N = 1, 4, 64, 1024


def kernel_tiles():
    """(block_q, block_k) that flash_numba_cpu runs on this machine for D = 64 in float32 when a call gives none."""
    from course_lib.kernels import cpu_steps as flash_numba_cpu
    return flash_numba_cpu.tile_sizes_for(D, D, np.dtype(np.float32).itemsize)


def ms_spread(ms) -> dict:
    """``bench.spread`` of a case's rounds in ms, every round kept, and its noise: how far the median
    sits above the fastest round."""
    summary = bench.spread(ms, "ms", every=True)
    return {**summary, "noise": summary["median_ms"] / summary["min_ms"] - 1}


def qkv(n, dtype=np.float32, seed=16):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, n, D)).astype(dtype) for _ in range(3))


def alternate(calls: dict, rounds: int) -> dict:
    """{name: [ms per round]}: ``bench.interleaved_rounds`` after one warm-up call each, in ms."""
    return {name: [t * 1e3 for t in ts] for name, ts in bench.interleaved_rounds(calls, rounds).items()}


def worker(rounds):
    """One process of the bandwidth group: its first call and ``rounds`` timed calls, as JSON on stdout."""
    import numba

    from course_lib import api
    q, k, v = qkv(N)
    start = time.perf_counter()
    api.attention(q, k, v, impl="flash_numba_cpu")
    first = (time.perf_counter() - start) * 1e3
    ms = alternate({"native": lambda: api.attention(q, k, v, impl="flash_numba_cpu")}, rounds)["native"]
    print(json.dumps({"threads": numba.config.NUMBA_NUM_THREADS, "first_ms": first, "times_ms": ms}))


def bandwidth_group(rounds, processes=3):
    per = {1: {"times_ms": [], "first_ms": []}, 2: {"times_ms": [], "first_ms": []}}
    for _ in range(processes):
        for threads in per:
            env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
            out = subprocess.run([sys.executable, __file__, "--worker", "--rounds", str(rounds)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            per[threads]["times_ms"] += got["times_ms"]
            per[threads]["first_ms"].append(got["first_ms"])
    from course_lib.core.flops import attention_flops
    return [dict(group="bandwidth", case=f"{t} core{'s' if t > 1 else ''}", threads=t, path="native", B=B, H=H,
                 N=N, D=D, dtype="float32", mask="none", flops=attention_flops(B, H, N, N, D),
                 first_ms=p["first_ms"], processes=processes, **ms_spread(p["times_ms"])) for t, p in per.items()]


def length_and_mask_groups(rounds, lengths):
    from course_lib import api
    from course_lib.bench import matrix
    from course_lib.core.flops import attention_flops
    from course_lib.models.iomodel import flash_io, naive_io
    from course_lib.models.memory import peak_bytes
    from course_lib.models.sram import tile_budget
    tile = kernel_tiles()
    sram = tile_budget(*tile, D, "float32").total_bytes
    out = []
    cases = [("length", n, "none") for n in lengths] + [("mask", N, m) for m in ("none", "causal", "window8", "window2")]
    for group, n, mask in cases:
        window = {"window8": (n // 8, 0), "window2": (n // 2, 0)}.get(mask, (-1, -1))
        causal = mask == "causal"
        bucket = matrix.Bucket("capstone", "prefill", B, H, n, n, D, "float32", "window" if window[0] > 0 else mask)
        q, k, v = matrix.inputs(bucket, seed=16)
        native = lambda: api.attention(q, k, v, impl="flash_numba_cpu", causal=causal, window_size=window)
        public, ran = matrix.sdpa_path(dataclasses.replace(bucket, mask="none") if mask == "none" else bucket, q, k, v)
        if window[0] > 0:   # sdpa_path builds the N/8 window of a Bucket; give it this one's
            import torch
            import torch.nn.functional as F

            from course_lib.core.masks import MaskSpec
            visible = torch.from_numpy(MaskSpec(n, n, window_size=window).visible(np.arange(n), np.arange(n)))
            tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
            public = lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=visible)
            ran = "torch_sdpa (mask tensor)"
        times = alternate({"native": native, "public": public}, rounds)
        peak = peak_bytes(native)
        opts = dict(causal=causal, window_size=window, batch=B, heads=H, block_q=tile[0], block_k=tile[1])
        flash = flash_io(n, n, D, "float32", **opts)
        naive = naive_io(n, n, D, "float32", batch=B, heads=H)
        case = {"none": "no mask", "causal": "causal", "window8": f"window ({n // 8}, 0)",
                "window2": f"window ({n // 2}, 0)"}[mask]
        for path, ms in times.items():
            out.append(dict(group=group, case=case, path=path, ran=ran if path == "public" else "flash_numba_cpu",
                            B=B, H=H, N=n, D=D, dtype="float32", mask=mask, window_size=list(window),
                            block_q=tile[0], block_k=tile[1],
                            flops=attention_flops(B, H, n, n, D, causal=causal, window_size=window),
                            model_flash_bytes=flash.bytes, model_naive_bytes=naive.bytes,
                            tile_sram_bytes=sram, native_peak_bytes=peak, s_bytes=B * H * n * n * 4,
                            io_bytes=4 * B * H * n * D * 4, **ms_spread(ms)))
    return out


def conversion_group(rounds, n=N):
    from course_lib import api
    from course_lib.core import options
    from course_lib.kernels import cpu_steps as kernel
    from course_lib.kernels import launch as host
    q16, k16, v16 = qkv(n, np.float16)
    tile = kernel_tiles()     # float16 inputs accumulate in float32: the same tiles
    grabbed = {}

    def grab(q, k, v, opts, mask):   # what a float16 call hands the compiled kernel
        grabbed["launch"], *grabbed["arrays"] = host.prepare(q, k, v, opts, mask, *tile)
        return kernel.flash_forward(q, k, v, opts, mask)
    options.call_forward(grab, q16, k16, v16)
    rounded = grabbed["launch"]
    plain = dataclasses.replace(rounded, round_bits=0, round_min_exponent=0)
    q32, k32, v32 = grabbed["arrays"]
    blocks = dict(block_q=tile[0], block_k=tile[1])   # the launch above: the same tiles, the same sums
    calls = {"float16 call": lambda: api.attention(q16, k16, v16, impl="flash_numba_cpu", **blocks),
             "inputs to float32 alone": lambda: [np.ascontiguousarray(x, np.float32) for x in (q16, k16, v16)],
             "kernel, P rounded to float16 in the loop": lambda: kernel.run_kernel(rounded, q32, k32, v32),
             "kernel, no rounding (the float32 launch)": lambda: kernel.run_kernel(plain, q32, k32, v32)}
    times = alternate(calls, rounds)
    same = np.array_equal(kernel.run_kernel(rounded, q32, k32, v32)[0].astype(np.float16),
                          api.attention(q16, k16, v16, impl="flash_numba_cpu", **blocks))
    return [dict(group="conversion", case=name, path="native", B=B, H=H, N=n, D=D, dtype="float16", mask="none",
                 block_q=tile[0], block_k=tile[1],
                 round_bits=rounded.round_bits, rounded_kernel_is_the_float16_call=bool(same), **ms_spread(ms))
            for name, ms in times.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.rounds)
    run, env = bench.new_run(), bench.environment()
    env["load_average"] = list(os.getloadavg())
    t0 = time.perf_counter()
    records = bandwidth_group(args.rounds) + length_and_mask_groups(args.rounds, args.lengths) + \
        conversion_group(args.rounds)
    env["load_average_end"] = list(os.getloadavg())
    bench.write_records(args.out, records, benchmark="capstone", run=run, run_id=run, device=env.get("cpu"),
                        environment=env)
    for r in records:
        print(f"{r['group']:10s} {r['case']:42s} {r['path']:7s} N={r['N']:5d} min {r['min_ms']:9.2f} "
              f"median {r['median_ms']:9.2f} max {r['max_ms']:9.2f} ms")
    print(f"{len(records)} records appended to {args.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
