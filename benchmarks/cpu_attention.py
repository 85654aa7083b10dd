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
  torch at (1, 8, 4096, 64) with 1, 2, ... threads, one process each, the points
  alternated over ``--rounds`` rounds (median, min, max and every round recorded).
- the headline (``benchmark="cpu_attention_headline"``): at (1, 8, 4096, 64),
  every impl in rounds, one worker process of each per round, so that a load
  that comes and goes on a shared machine hits them alike and no library's
  idle threads (OpenMP and OpenBLAS spin a while after a call) slow the next
  one down; the median over the rounds is recorded, and the ratios the
  chapter quotes come from here.

Chapter 08's steps (``--parts steps targets decode tiles roofline phases contention``, each part
appending records of its own benchmark name):

- ``cpu_steps``: every step of the kernel (``flash_numba_cpu_microkernel`` ...
  ``flash_numba_cpu``) and torch at (1, 8, 2048, 64);
- ``cpu_targets``: flash_numba_cpu and torch at the issue's shapes, (1, 8, 4096, 64),
  (1, 8, 4096, 128), causal (1, 8, 4096, 64), N = 1024 and 2048, and naive once
  at N = 4096 for the memory comparison;
- ``cpu_decode``: one query row against 32K keys, batch 8, 16 heads;
- ``cpu_tiles``: flash_numba_cpu's (block_q, block_k) sweep at (1, 8, 2048, 64);
- ``cpu_roofline``: this machine's float32 matmul rate (numpy's BLAS, every
  core; on a CPU with AVX-512 the faster of the environment's OpenBLAS
  kernels and its AVX-512 ones, both recorded) and copy bandwidth, measured
  in workers of their own;
- ``cpu_contention``: steps 11 and 12 (``flash_numba_cpu_scratch``,
  ``flash_numba_cpu``) and torch at the shapes of ``CONTENTION``, alternated,
  while one busy process (a Python ``while True``) competes for the cores;
- ``cpu_phases``: on one thread, where flash_numba_cpu's time goes at the
  shapes of ``PHASES``: the kernel, its tile matmuls alone, its row passes
  alone, and torch on one thread; and the page faults of one call of the
  kernel and of ``flash_numba_cpu_wide`` (tile buffers allocated per work
  item), with that step's time; on a CPU with AVX-512, all of it once more
  with the other of OpenBLAS's AVX2 and AVX-512 kernels (``OPENBLAS_CORETYPE``
  ``Haswell`` or ``SkylakeX``; without it OpenBLAS picks its kernels from the
  CPU), each record saying which kernels it ran (``blas_core``) and, in its
  environment's ``cpu_identity``, on which microarchitecture.

Every round records the 1-minute load average its worker saw (``load_1min``).

In ``steps``, ``targets`` and ``decode`` every impl runs in a process of its
own and the impls alternate, round after round (``--rounds``, at least 3): the
record keeps every round (``rounds_s``) and their min, median and max, so that
the noise of a shared machine is shown, not hidden.  Workers are fresh
interpreters (``subprocess``: a spawn, never a fork of a process that already
ran numba's threads, which its OpenMP layer does not survive).

PyTorch's CPU build is one of the course's dependencies (pyproject.toml).  Its
``scaled_dot_product_attention`` on the CPU is itself a FlashAttention kernel
(``torch_sdpa_flash``).  Threads: numba and torch each use every core here.

A benchmark, not a test: nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "cpu_attention.jsonl"
IMPLS = ("naive", "flash_numpy", "flash_numba_cpu", "torch_sdpa_flash")
STEPS = ("flash_numba_cpu_microkernel", "flash_numba_cpu_blas", "flash_numba_cpu_rowvec",
         "flash_numba_cpu_balanced", "flash_numba_cpu_tuned", "flash_numba_cpu_exp2", "flash_numba_cpu_wide",
         "flash_numba_cpu_scratch", "flash_numba_cpu")
PHASES = (((1, 8, 4096, 64), False), ((1, 8, 4096, 128), False), ((1, 8, 1024, 64), False))
STEPS_SHAPE = (1, 8, 2048, 64)
TARGETS = (((1, 8, 4096, 64), False), ((1, 8, 4096, 128), False), ((1, 8, 4096, 64), True),
           ((1, 8, 1024, 64), False), ((1, 8, 2048, 64), False))
CONTENTION = (((1, 8, 4096, 64), True), ((1, 8, 2048, 64), False))   # beside one busy process
DECODE = (8, 16, 32768, 64)    # batch, heads, keys, head_dim; one query row
TILE_SWEEP = [(br, bc) for br in (64, 128, 256) for bc in (64, 128, 256, 512)]
HEADLINE = (1, 8, 4096, 64)
REPEATS_BELOW_S = 3.0  # a call shorter than this is repeated (median of 3); a longer one timed once


# -- the worker: one impl, one shape, in a process of its own ------------------------

def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def make_call(impl, q, k, v, causal, tiles=None):
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
    blocks = dict(block_q=tiles[0], block_k=tiles[1]) if tiles else {}
    return lambda: course_lib.attention(q, k, v, impl=impl, causal=causal, **blocks)


def inputs(shape, seed=0, nq=None):
    """Seeded float32 q, k, v; q has ``nq`` rows when given (decoding), else N."""
    B, H, N, D = shape
    rng = np.random.default_rng(seed)
    block = min(N, 4096)    # longer keys repeat a 4096-key block: the time does not depend on the values

    def one(rows):
        x = rng.standard_normal((B, H, min(rows, block), D), dtype=np.float32)
        return np.ascontiguousarray(np.tile(x, (1, 1, -(-rows // block), 1))[:, :, :rows]) if rows > block else x
    return tuple(one(rows) for rows in (nq or N, N, N))


def resident_bytes(field):
    """VmRSS or VmHWM (the peak since the last reset) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(impl, shape, causal, nq=None, tiles=None):
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
        # only the library that runs: numba.set_num_threads starts numba's thread pool, whose idle
        # threads spin on the cores torch's own threads need (torch at 2 threads ran 3x slower than
        # at 1 with it, run 20261202T152607+0000)
        if impl.startswith("torch_"):
            import torch
            torch.set_num_threads(int(threads))
        else:
            import numba
            numba.set_num_threads(int(threads))
    q, k, v = inputs(shape, nq=nq)
    small = tuple(x[:, :, :128].copy() for x in (q, k, v))
    start = time.perf_counter()
    make_call(impl, *small, causal, tiles)()          # compile (or load the cache), warm up
    warmup_s = time.perf_counter() - start
    call = make_call(impl, q, k, v, causal, tiles)
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
    print(json.dumps({"time_s": float(np.median(times)), "min_s": min(times), "repeats": len(times), "times_s": times,
                      "peak_bytes": int(peak), "warmup_s": warmup_s, "load_1min": os.getloadavg()[0]}))


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
        # every (impl, threads) point once per round, the points alternated, --rounds rounds: a busy moment
        # of the shared machine spoils one round of one point, not the point
        cores = len(os.sched_getaffinity(0))
        points = [(impl, threads) for impl in impls if impl in ("flash_numba_cpu", "torch_sdpa_flash")
                  for threads in range(1, cores + 1)]
        rounds = {point: [] for point in points}
        for _ in tqdm(range(args.rounds), desc="threads", unit="round"):
            for impl, threads in points:
                rounds[impl, threads].append(run_worker(["--worker", impl, *map(str, HEADLINE), "0"],
                                                        COURSE_THREADS=str(threads)))
        for (impl, threads), rs in rounds.items():
            times = [r["time_s"] for r in rs]
            bench.append_record(args.out, benchmark="cpu_attention_threads", run=run, env=env, impl=impl,
                                shape=(*HEADLINE[:3], HEADLINE[2], HEADLINE[3]), dtype="float32",
                                time_s=float(np.median(times)), min_s=min(times), max_s=max(times), rounds_s=times,
                                threads=threads, repeats=rs[0]["repeats"],
                                load_1min=[r.get("load_1min") for r in rs],
                                process="own, one per point per round, points alternated")
            print(f"{impl:>16} with {threads} thread(s): median {np.median(times):.3f} s "
                  f"(min {min(times):.3f}, max {max(times):.3f}, {len(times)} rounds)")

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


# -- chapter 08's steps: alternated rounds, one process per impl per round ------------

def worker_args(impl, shape, causal, nq=None, tiles=None):
    extra = [str(nq or 0), *(map(str, tiles) if tiles else ["0", "0"])]
    return ["--worker", impl, *map(str, shape), str(int(causal)), *extra]


def alternated(cases, rounds, desc):
    """{case: [worker result per round]}: every case once per round, in the same order, ``rounds`` times."""
    from tqdm import tqdm
    results = {case: [] for case in cases}
    for _ in tqdm(range(rounds), desc=desc, unit="round"):
        for case in cases:
            impl, shape, causal, nq = case
            results[case].append(run_worker(worker_args(impl, shape, causal, nq)))
    return results


def record_rounds(out, benchmark, run, env, results):
    from course_lib import bench
    for (impl, shape, causal, nq), rs in results.items():
        B, H, N, D = shape
        # a round's time: the fastest of the worker's own repeats (1 to 3 calls)
        times = [r["min_s"] for r in rs]
        bench.append_record(out, benchmark=benchmark, run=run, env=env, impl=impl,
                            shape=(B, H, nq or N, N, D), dtype="float32", causal=causal,
                            rounds_s=times, worker_times_s=[r["times_s"] for r in rs],
                            load_1min=[r.get("load_1min") for r in rs],
                            peak_bytes=int(np.median([r["peak_bytes"] for r in rs])),
                            process="own, one per impl per round, impls alternated", **bench.spread(times, "s"),
                            time_s=float(np.median(times)))
        print(f"  {impl:>28} {shape} {'causal' if causal else 'full'} nq={nq or N}: "
              f"min {min(times):.3f}  median {np.median(times):.3f}  max {max(times):.3f} s"
              f"  (load {', '.join(format(r.get('load_1min') or 0, '.1f') for r in rs)})")


def run_parts(parts, rounds, out):
    from course_lib import bench
    env = bench.environment()
    if torch_available():
        import torch
        env["torch"] = torch.__version__
    run = bench.new_run()
    print(f"run {run}: parts {parts}, {rounds} rounds; records -> {out}")
    torch_impl = "torch_sdpa_flash"
    if "roofline" in parts:
        # numpy's matmul with the BLAS kernels this environment gives, and (AVX-512 CPU) with OpenBLAS's
        # AVX-512 kernels: the compute roof is the faster, this CPU's FMA rate as far as a BLAS reaches it.
        start = time.perf_counter()
        by_blas = {}
        for blas_env in [{}] + ([{"OPENBLAS_CORETYPE": "SkylakeX"}] if avx512() else []):
            r = run_worker(["--roofline"], **blas_env)
            by_blas[r.pop("blas_core")] = r
        best = max(by_blas.values(), key=lambda r: r["matmul_flops"])
        result = {**best, "matmul_flops_by_blas": {core: r["matmul_flops"] for core, r in by_blas.items()},
                  **{field: max(r[field] for r in by_blas.values())
                     for field in ("bandwidth", "copy_bandwidth", "read_bandwidth")},
                  "what": best["what"] + "; the faster of OpenBLAS's kernels (matmul_flops_by_blas)"}
        bench.append_record(out, benchmark="cpu_roofline", run=run, env=env, impl="numpy", shape=(1, 1, 1, 1, 1),
                            dtype="float32", time_s=time.perf_counter() - start, **result)
        print(f"  roofline: {result['matmul_flops'] / 1e9:.1f} GFLOP/s float32 matmul "
              f"({', '.join(f'{core} {f / 1e9:.1f}' for core, f in result['matmul_flops_by_blas'].items())}), "
              f"{result['copy_bandwidth'] / 1e9:.1f} GB/s copy on one core, {result['read_bandwidth'] / 1e9:.1f} GB/s "
              f"read on every core")
    if "steps" in parts:
        cases = [(impl, STEPS_SHAPE, False, None) for impl in (*STEPS, torch_impl)]
        record_rounds(out, "cpu_steps", run, env, alternated(cases, rounds, "steps"))
    if "targets" in parts:
        cases = [(impl, shape, causal, None) for shape, causal in TARGETS for impl in ("flash_numba_cpu", torch_impl)]
        record_rounds(out, "cpu_targets", run, env, alternated(cases, rounds, "targets"))
        record_rounds(out, "cpu_targets", run, env, alternated([("naive", TARGETS[0][0], False, None)], 1, "naive"))
    if "decode" in parts:
        B, H, N, D = DECODE
        cases = [(impl, (B, H, N, D), False, 1) for impl in ("flash_numba_cpu", torch_impl)]
        record_rounds(out, "cpu_decode", run, env, alternated(cases, rounds, "decode"))
    if "contention" in parts:
        # One busy process beside the kernels, for the whole part: a thread that shares its core with it
        # runs at half speed, the case step 12's hand-out is for.
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            cases = [(impl, shape, causal, None) for shape, causal in CONTENTION
                     for impl in ("flash_numba_cpu_scratch", "flash_numba_cpu", torch_impl)]
            results = alternated(cases, rounds, "contention")
        finally:
            busy.kill()
            busy.wait()
        record_rounds(out, "cpu_contention", run, env, results)
    if "phases" in parts:
        # As this environment sets OpenBLAS up (OPENBLAS_CORETYPE, if set, picks its kernels, else the
        # CPU does), and, on a CPU with AVX-512, once more with the other of OpenBLAS's AVX2 ("Haswell")
        # and AVX-512 ("SkylakeX") kernels; each record says which it ran (blas_core).
        from course_lib.kernels import cpu_steps
        chosen = cpu_steps.blas_core()
        cores = [{}] + ([{"OPENBLAS_CORETYPE": "Haswell" if chosen == "SkylakeX" else "SkylakeX"}]
                        if avx512() else [])
        for (shape, causal), blas_env in [(case, e) for e in cores for case in PHASES]:
            r = run_worker(["--phases", *map(str, shape)], **blas_env)
            B, H, N, D = shape
            bench.append_record(out, benchmark="cpu_phases", run=run, env=env, impl="flash_numba_cpu",
                                shape=(B, H, N, N, D), dtype="float32", causal=causal, time_s=r["kernel_s"],
                                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE") if not blas_env
                                else blas_env["OPENBLAS_CORETYPE"], **r)
            print(f"  phases {shape}, BLAS {r['blas_core']}, one thread, tiles {r['tiles']}: "
                  f"kernel {r['kernel_s']:.3f} s, matmuls alone "
                  f"{r['matmuls_s']:.3f} s, row passes alone {r['row_pass_s']:.3f} s, torch {r['torch_s']:.3f} s; "
                  f"buffers per item {r['buffers_per_item_s']:.3f} s; page faults a call "
                  f"{r['kernel_faults']} (per item: {r['buffers_per_item_faults']})")
    if "tiles" in parts:
        from tqdm import tqdm
        for tiles in tqdm(TILE_SWEEP, desc="tiles", unit="tile"):
            r = run_worker(worker_args("flash_numba_cpu", STEPS_SHAPE, False, None, tiles))
            B, H, N, D = STEPS_SHAPE
            bench.append_record(out, benchmark="cpu_tiles", run=run, env=env, impl="flash_numba_cpu",
                                shape=(B, H, N, N, D), dtype="float32", block_q=tiles[0], block_k=tiles[1],
                                time_s=r["min_s"], times_s=r["times_s"])
            tqdm.write(f"  tiles {tiles}: {r['min_s']:.3f} s (fastest of {len(r['times_s'])})")
    print(f"records appended to {out}")


def avx512():
    """Whether this CPU has the AVX-512 parts OpenBLAS's SkylakeX kernels use (Linux's flags)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"} <= set(flags.split(":", 1)[1].split())


def phases_worker(shape, repeats=5):
    """Where one thread's time goes in flash_numba_cpu at ``shape``: the kernel, its tile matmuls alone
    (the same np.dot calls on the same tiles), its row passes alone (softmax_tile_exp2 on a tile of scores, as
    many times as the kernel calls it), and torch on one thread; each the fastest of ``repeats`` rounds, the
    pieces in turn within a round."""
    import numba
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import course_lib
    from course_lib.core import rules
    from course_lib.kernels import cpu_steps as fnc
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    fnc.scipy_openblas().scipy_openblas_set_num_threads(1)
    B, H, N, D = shape
    q, k, v = inputs(shape)
    Br, Bc = fnc.wide_tiles(N)

    @numba.njit
    def matmuls(q, k, v, Br, Bc):
        S, PV = np.empty((Br, Bc), q.dtype), np.empty((Br, v.shape[3]), q.dtype)
        for h in range(q.shape[1]):
            for r0 in range(0, q.shape[2], Br):
                for c0 in range(0, k.shape[2], Bc):
                    np.dot(q[0, h, r0:r0 + Br], k[0, h, c0:c0 + Bc].T, S)
                    np.dot(S, v[0, h, c0:c0 + Bc], PV)

    @numba.njit
    def row_passes(scores, tiles, Dv, form):
        Br, Bc = scores.shape
        S = np.empty_like(scores)
        m, l, Oi = np.full(Br, -np.inf, np.float32), np.zeros(Br, np.float32), np.zeros((Br, Dv), np.float32)
        for _ in range(tiles):
            S[:] = scores                                              # a fresh tile of scores, as the GEMM writes it
            if form:
                fnc.softmax_tile_exp2(S, Br, Bc, 0, 0, rules.FULL, np.float32(0), False, 0.0, 0, -1, -1, True,
                                      m, l, Oi)

    def faults(call):
        """Minor page faults during one call: memory the OS had to hand the process (first touch)."""
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        call()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    scores = (np.random.default_rng(1).standard_normal((Br, Bc)) * 2).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

    def torch_call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    tiles = H * -(-N // Br) * -(-N // Bc)

    def kernel():
        course_lib.attention(q, k, v, impl="flash_numba_cpu")

    def per_item():                                                    # the step before "scratch"
        course_lib.attention(q, k, v, impl="flash_numba_cpu_wide")
    pieces = {"kernel_s": kernel, "buffers_per_item_s": per_item, "matmuls_s": lambda: matmuls(q, k, v, Br, Bc),
              "row_pass_s": lambda: row_passes(scores, tiles, D, True), "torch_s": torch_call,
              "copies_s": lambda: row_passes(scores, tiles, D, False)}  # the copies alone, taken off the row pass
    for call in pieces.values():
        call()                                                         # compile, fault in
    # The pieces in turn, round after round, the fastest of each kept: a load that comes and goes on a
    # shared machine slows every piece's rounds alike instead of one piece's.
    rounds, loads = {name: [] for name in pieces}, []
    for _ in range(repeats):
        loads.append(os.getloadavg()[0])
        for name, call in pieces.items():
            start = time.perf_counter()
            call()
            rounds[name].append(time.perf_counter() - start)
    fastest = {name: min(times) for name, times in rounds.items()}
    print(json.dumps({
        **{name: fastest[name] for name in ("kernel_s", "buffers_per_item_s", "matmuls_s", "torch_s")},
        "row_pass_s": fastest["row_pass_s"] - fastest["copies_s"],
        "kernel_faults": faults(kernel), "buffers_per_item_faults": faults(per_item),
        "malloc_env": {name: os.environ.get(name) for name in MALLOC_ENV},
        "rounds_s": rounds, "tiles": [Br, Bc], "threads": 1, "load_1min": max(loads), "loads_1min": loads,
        "blas_core": fnc.blas_core(),
        "what": "one thread: the kernel, its tile matmuls alone, its row passes alone (softmax_tile_exp2), torch, "
                "flash_numba_cpu_wide (buffers per item), in turn, the fastest of the rounds; page faults of one "
                "call each"}))


def roofline_worker(runs=7):
    """This machine's float32 matmul rate on every core and its copy bandwidth: the best of ``runs``.

    The matmul is numpy's BLAS at n = 2048 (every core: the compute roof a
    kernel on both cores can reach; ``blas_core`` names the OpenBLAS kernels
    it ran); the copy moves 256 MiB each way on one core (numpy's copy has
    one thread), the read streams 1 GiB over every core (a prange sum): the
    bandwidth roof is the faster of the two.  The best run, since load from
    other programs only ever slows a run down.
    """
    import os
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2048, 2048), dtype=np.float32) for _ in range(2))
    c = np.empty_like(a)
    src = np.ones(64 * 2 ** 20, np.float32)
    dst = np.empty_like(src)
    import numba

    @numba.njit(parallel=True, fastmath={"reassoc"})
    def read_all(x):                 # every core streams its share of x once: DRAM's read bandwidth
        total = np.float32(0)
        for i in numba.prange(x.shape[0]):
            total += x[i]
        return total

    big = np.ones(256 * 2 ** 20, np.float32)      # 1 GiB, far beyond the caches
    read_all(big[:1024])
    matmul, copy, read = [], [], []
    for _ in range(runs):
        for times, work in ((matmul, lambda: np.matmul(a, b, out=c)), (copy, lambda: np.copyto(dst, src)),
                            (read, lambda: read_all(big))):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
    import ctypes
    import glob
    blas_core = "unknown"
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*.so")):
        library = ctypes.CDLL(path)
        corename = next((getattr(library, name) for name in ("scipy_openblas_get_corename64_",
                                                              "scipy_openblas_get_corename")
                         if hasattr(library, name)), None)
        if corename is not None:
            corename.restype = ctypes.c_char_p
            blas_core = corename().decode()
    copy_bandwidth, read_bandwidth = 2 * src.nbytes / min(copy), big.nbytes / min(read)
    print(json.dumps({"matmul_flops": 2 * 2048 ** 3 / min(matmul), "bandwidth": max(copy_bandwidth, read_bandwidth),
                      "copy_bandwidth": copy_bandwidth, "read_bandwidth": read_bandwidth, "read_runs_s": read,
                      "blas_core": blas_core,
                      "matmul_runs_s": matmul, "copy_runs_s": copy, "threads": len(os.sched_getaffinity(0)),
                      "what": f"numpy float32 matmul n=2048, a 256 MiB copy and a 1 GiB read on every core, "
                              f"best of {runs} runs"}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        impl, B, H, N, D, causal = sys.argv[2], *map(int, sys.argv[3:8])
        nq, br, bc = (list(map(int, sys.argv[8:11])) + [0, 0, 0])[:3]
        worker(impl, (B, H, N, D), bool(causal), nq or None, (br, bc) if br else None)
    elif len(sys.argv) > 1 and sys.argv[1] == "--phases":
        phases_worker(tuple(map(int, sys.argv[2:6])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--roofline":
        roofline_worker()
    elif len(sys.argv) > 1 and sys.argv[1] == "--parts":
        parser = argparse.ArgumentParser()
        parser.add_argument("--parts", nargs="+",
                            choices=("roofline", "steps", "targets", "decode", "tiles", "phases", "contention"))
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--out", type=Path, default=RECORDS)
        parts_args = parser.parse_args()
        run_parts(parts_args.parts, max(parts_args.rounds, 3), parts_args.out)
    else:
        main()
