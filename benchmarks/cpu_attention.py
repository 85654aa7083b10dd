"""Attention on this CPU: naive, flash_numpy, flash_numba_cpu and PyTorch's own kernel.  (chapter 08)

    .venv/bin/python benchmarks/cpu_attention.py             # the sweep, then the headline ratios
    .venv/bin/python benchmarks/cpu_attention.py --sizes 512 1024 --head-dims 64 --impls naive flash_numba_cpu

Two parts, both appending to ``notebooks/records/cpu_attention.jsonl``, where
chapter 08 plots them:

- the sweep (``benchmark="cpu_attention"``): N from 512 to 16384, D 64 and
  128, causal or not, float32, B=1, H=8.  Each measurement runs in a process
  of its own, so its peak memory is its own: the worker resets the kernel's
  peak-RSS counter (Linux: ``/proc/self/clear_refs``) after the inputs exist
  and the kernel is compiled, runs the call once, and reports how far the
  resident set rose above where it stood (``peak_bytes``).  naive is not run
  where S and its softmax would not fit in this machine's memory; the record
  says so (``skipped``).
- the first compile (``benchmark="cpu_attention_compile"``): flash_numba_cpu's
  first call in a process with an empty numba cache (``NUMBA_CACHE_DIR`` set
  to a fresh folder), then with that cache filled: what a learner waits for
  once, and then every time.
- thread scaling (``benchmark="cpu_attention_threads"``): flash_numba_cpu and
  torch at (1, 8, 4096, 64) with 1, 2, ... threads, one process each.
- the headline (``benchmark="cpu_attention_headline"``): at (1, 8, 4096, 64),
  every impl in rounds, one worker process of each per round, so that a load
  that comes and goes on a shared machine hits them alike and no library's
  idle threads (OpenMP and OpenBLAS spin a while after a call) slow the next
  one down; the median over the rounds is recorded, and the ratios the
  chapter quotes come from here.

PyTorch's CPU build is one of the course's dependencies (pyproject.toml).  Its
``scaled_dot_product_attention`` on the CPU is itself a FlashAttention kernel
(``torch_sdpa_flash``).  Threads: numba and torch each use every core here.

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
RECORDS = ROOT / "notebooks" / "records" / "cpu_attention.jsonl"
IMPLS = ("naive", "flash_numpy", "flash_numba_cpu", "torch_sdpa_flash")
HEADLINE = (1, 8, 4096, 64)
REPEATS_BELOW_S = 3.0  # a call shorter than this is repeated (median of 3); a longer one timed once


# -- the worker: one impl, one shape, in a process of its own ------------------------

def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def make_call(impl, q, k, v, causal):
    """A zero-argument callable that runs ``impl`` once on (q, k, v)."""
    if impl.startswith("torch_"):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

        def call():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                # top-left and bottom-right causal agree here: Nq == Nk
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        return call
    import course_lib
    return lambda: course_lib.attention(q, k, v, impl=impl, causal=causal)


def inputs(shape, seed=0):
    B, H, N, D = shape
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, N, D)).astype(np.float32) for _ in range(3))


def resident_bytes(field):
    """VmRSS or VmHWM (the peak since the last reset) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(impl, shape, causal):
    """One impl at one shape; prints one JSON line.

    The median time of 3 calls (1 when a call takes longer than
    REPEATS_BELOW_S), how long the first, compiling call on a small problem
    took, and how far the resident set rose above where it stood during the
    first timed call (``peak_bytes``; run with MALLOC_ENV so that it shows).
    ``COURSE_THREADS`` in the environment, when set, is the number of threads
    numba and torch may use (the thread-scaling part).
    """
    threads = os.environ.get("COURSE_THREADS")
    if threads:
        import numba
        numba.set_num_threads(int(threads))
        if impl.startswith("torch_"):
            import torch
            torch.set_num_threads(int(threads))
    q, k, v = inputs(shape)
    small = tuple(x[:, :, :128].copy() for x in (q, k, v))
    start = time.perf_counter()
    make_call(impl, *small, causal)()                 # compile (or load the cache), warm up
    warmup_s = time.perf_counter() - start
    call = make_call(impl, q, k, v, causal)
    times, peak = [], None
    while len(times) < 3 and (not times or times[0] < REPEATS_BELOW_S):
        if peak is None:
            before = resident_bytes("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter (VmHWM)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        if peak is None:
            peak = resident_bytes("VmHWM") - before
    print(json.dumps({"time_s": float(np.median(times)), "repeats": len(times), "times_s": times,
                      "peak_bytes": int(peak), "warmup_s": warmup_s}))


# -- the driver ------------------------------------------------------------------------

def naive_fits(shape, budget_bytes):
    """naive holds S, exp(S - max) and P at once: about 3 float32 (B, H, N, N) arrays."""
    B, H, N, _ = shape
    return 3 * B * H * N * N * 4 <= budget_bytes


# glibc serves large blocks with mmap and returns them to the OS on free(), but
# it raises that threshold whenever such a block is freed; later blocks then
# come from memory that is already resident, and the RSS no longer shows them.
# Fixing the threshold keeps every block above 1 MiB visible (numpy's tile
# temporaries stay below it, so the timing is not changed by it).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)}


def run_worker(args, **env):
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False,
                         env={**os.environ, **MALLOC_ENV, **env})
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the headline")
    parser.add_argument("--naive-budget-gib", type=float, default=None,
                        help="largest S naive may materialise (default: half this machine's memory)")
    parser.add_argument("--max-seconds", type=float, default=40.0,
                        help="skip a case whose call would take longer, judged from the last N (time grows as N^2)")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-threads", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-headline", action="store_true")
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from course_lib import bench
    impls = list(args.impls)
    if any(i.startswith("torch_") for i in impls) and not torch_available():
        print("PyTorch is not installed: torch_sdpa_flash is left out "
              "(make venv installs the pinned CPU build)")
        impls = [i for i in impls if not i.startswith("torch_")]
    env = bench.environment()
    if torch_available():
        import torch
        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    import numba
    env["numba_threads"] = numba.get_num_threads()
    run = bench.new_run()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = args.naive_budget_gib * 2 ** 30 if args.naive_budget_gib else total / 2
    print(f"run {run} on {env['cpu']} ({env['cpu_cores']['usable']} cores), float32, "
          f"B={args.batch} H={args.heads}; records -> {args.out}")

    if not args.no_sweep:
        last_time = {}  # (impl, D, causal) -> (N, seconds) of the last case measured
        cases = [(impl, n, d, causal) for d in args.head_dims for causal in (False, True)
                 for n in args.sizes for impl in impls]
        for impl, n, d, causal in tqdm(cases, desc="sweep", unit="case"):
            shape = (args.batch, args.heads, n, d)
            common = dict(benchmark="cpu_attention", run=run, env=env, impl=impl, shape=(*shape[:3], n, d),
                          dtype="float32", causal=causal)
            if impl == "naive" and not naive_fits(shape, budget):
                tqdm.write(f"naive N={n} D={d}: skipped, S would need {3 * args.batch * args.heads * n * n * 4 / 2**30:.1f} GiB")
                continue
            previous = last_time.get((impl, d, causal))
            if previous and previous[1] * (n / previous[0]) ** 2 > args.max_seconds:
                tqdm.write(f"{impl} N={n} D={d}: skipped, about {previous[1] * (n / previous[0]) ** 2:.0f} s a call "
                           f"(over --max-seconds {args.max_seconds:g})")
                continue
            result = run_worker(["--worker", impl, *map(str, shape), str(int(causal))])
            last_time[(impl, d, causal)] = (n, result["time_s"])
            bench.append_record(args.out, time_s=result["time_s"], repeats=result["repeats"],
                                times_s=result["times_s"], peak_bytes=result["peak_bytes"],
                                warmup_s=result["warmup_s"], process="own", **common)
            tqdm.write(f"{impl:>16} N={n:>5} D={d:>3} {'causal' if causal else 'full  '} "
                       f"{result['time_s']:8.3f} s  peak {result['peak_bytes'] / 2**20:8.1f} MiB")

    if not args.no_compile and "flash_numba_cpu" in impls:
        import tempfile
        with tempfile.TemporaryDirectory() as cache:
            for state in ("empty cache", "cache filled"):
                result = run_worker(["--worker", "flash_numba_cpu", "1", "8", "512", "64", "0"], NUMBA_CACHE_DIR=cache)
                bench.append_record(args.out, benchmark="cpu_attention_compile", run=run, env=env,
                                    impl="flash_numba_cpu", shape=(1, 8, 512, 512, 64), dtype="float32",
                                    time_s=result["warmup_s"], cache=state,
                                    what="first call in a fresh process, on a (1, 8, 128, 64) problem")
                print(f"flash_numba_cpu first call, {state}: {result['warmup_s']:.1f} s")

    if not args.no_threads:
        cores = len(os.sched_getaffinity(0))
        for impl in [i for i in impls if i in ("flash_numba_cpu", "torch_sdpa_flash")]:
            for threads in range(1, cores + 1):
                result = run_worker(["--worker", impl, *map(str, HEADLINE), "0"], COURSE_THREADS=str(threads))
                bench.append_record(args.out, benchmark="cpu_attention_threads", run=run, env=env, impl=impl,
                                    shape=(*HEADLINE[:3], HEADLINE[2], HEADLINE[3]), dtype="float32",
                                    time_s=result["time_s"], threads=threads, repeats=result["repeats"])
                print(f"{impl:>16} with {threads} thread(s): {result['time_s']:.3f} s")

    if not args.no_headline:
        print(f"headline at {HEADLINE}: {args.rounds} rounds, one process per impl per round")
        medians = {}
        for causal in (False, True):
            rounds = {impl: [] for impl in impls}
            for _ in tqdm(range(args.rounds), desc=f"headline {'causal' if causal else 'full'}", unit="round"):
                for impl in impls:
                    rounds[impl].append(run_worker(["--worker", impl, *map(str, HEADLINE), str(int(causal))]))
            medians[causal] = {impl: float(np.median([r["time_s"] for r in rs])) for impl, rs in rounds.items()}
            for impl, rs in rounds.items():
                bench.append_record(args.out, benchmark="cpu_attention_headline", run=run, env=env,
                                    impl=impl, shape=(*HEADLINE[:3], HEADLINE[2], HEADLINE[3]),
                                    dtype="float32", causal=causal, time_s=medians[causal][impl],
                                    rounds_s=[r["time_s"] for r in rs],
                                    peak_bytes=int(np.median([r["peak_bytes"] for r in rs])),
                                    process="own, one per round, rounds interleaved")
        full, causal = medians[False], medians[True]
        for impl in impls:
            print(f"  {impl:>16}: {full[impl]:7.3f} s full, {causal[impl]:7.3f} s causal "
                  f"(causal {full[impl] / causal[impl]:.2f}x faster); flash_numba_cpu "
                  f"{full[impl] / full['flash_numba_cpu']:.2f}x faster")
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        impl, B, H, N, D, causal = sys.argv[2], *map(int, sys.argv[3:8])
        worker(impl, (B, H, N, D), bool(causal))
    else:
        main()
