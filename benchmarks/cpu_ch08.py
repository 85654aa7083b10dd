"""Chapter 08's explanations, measured on this CPU and recorded with its microarchitecture.  (chapter 08)

    .venv/bin/python benchmarks/cpu_ch08.py                  # every part
    .venv/bin/python benchmarks/cpu_ch08.py --parts prange pages --rounds 5

Each part appends records of its own ``benchmark`` name to
``notebooks/records/cpu_ch08.jsonl``; every record's ``environment`` carries
``cpu_identity`` (vendor, family / model / stepping, microarchitecture, SIMD
extensions), so a claim read from it can name the CPU that showed it.

- ``ch08_prange``: the chapter's own step 1 (one row at a time, ``njit``) and
  step 2 (the same rows under ``prange``), read from the notebook's cells so
  they cannot drift from what the chapter prints, at (1, 8, 1024, 64): step 1,
  step 2 on one thread (``numba.set_num_threads(1)``) and on every core, and
  step 2's body with ``range`` in a plain ``njit`` (the flat row index and the
  per-row ``o``, without the parfor lowering).  Step 2 on one thread against
  step 1 is the cost of the code ``prange`` made, with no thread in it.
- ``ch08_dot``: section 2's dot product of 10**6 float64: the plain loop under
  ``njit``, the same loop with ``cpu_steps.FASTMATH``, and ``np.dot`` on one
  and on every thread of numpy's OpenBLAS.
- ``ch08_pages``: ``np.exp`` of a 256 MiB float32 array into a fresh array
  (every page first touched, so the kernel faults it in and zeroes it) and into
  one already touched, with the minor page faults of each; and naive attention
  at (1, 2, 4096, 64), whose scores are 128 MiB, in worker processes: as glibc's
  malloc gives it each large temporary (a fresh mapping), and with mmap and
  trimming off (``REUSED_PAGES_ENV``: freed pages reused), with its page faults.
- ``ch08_simd``: the FMAs in the machine code LLVM makes here of section 4's
  two matmuls, the notebook's register-blocked ``micro_4x16`` and
  ``cpu_steps.matmul_nt``, counted by register width (zmm, ymm, xmm), packed or
  scalar, and with a register or a memory operand (``bench.simd``).

Timings are the fastest of ``--rounds`` rounds (a shared machine only ever
slows a round down), the contenders of a part alternated round by round; each
round records the 1-minute load average beside it.  A benchmark, not a test:
nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "cpu_ch08.jsonl"
NOTEBOOK = ROOT / "notebooks" / "08_numba_cpu.ipynb"
PARTS = ("prange", "dot", "pages", "simd")
PRANGE_SHAPE = (1, 8, 1024, 64)
PAGES_BYTES = 256 * 2 ** 20
NAIVE_SHAPE = (1, 2, 4096, 64)


def notebook_code(*cell_ids) -> dict:
    """The source of the notebook's cells ``cell_ids``, by id."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return {c["id"]: "".join(c["source"]) for c in cells if c.get("id") in cell_ids}


def chapter_namespace():
    """What the chapter's step cells use, as its setup cell defines it (``check_steps`` left out)."""
    import numba

    from course_lib.core import rules
    return {"np": np, "numba": numba, "math": math, "rules": rules, "check_steps": lambda *args: None,
            **{name: numba.njit(getattr(rules, name)) for name in ("visible", "max_nan", "rescale", "shift_of",
                                                                    "finalize")}}


def load_now():
    return os.getloadavg()[0]


def rounds_of(contenders, rounds):
    """{name: [seconds per round]} and [load per round]: every contender once a round, in turn."""
    for call in contenders.values():
        call()                                                  # compile, fault in
    times, loads = {name: [] for name in contenders}, []
    for _ in range(rounds):
        loads.append(load_now())
        for name, call in contenders.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times, loads


def numpy_openblas():
    """numpy's own OpenBLAS (it is not SciPy's) as ctypes functions: (set_num_threads, get_num_threads)."""
    folder = os.path.dirname(np.__file__) + ".libs"
    for path in glob.glob(os.path.join(folder, "libscipy_openblas*.so")):
        library = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            if hasattr(library, f"scipy_openblas_set_num_threads{suffix}"):
                return (getattr(library, f"scipy_openblas_set_num_threads{suffix}"),
                        getattr(library, f"scipy_openblas_get_num_threads{suffix}"))
    return None


def part_prange(rounds):
    import numba

    from course_lib.core.options import call_forward
    namespace = chapter_namespace()
    code = notebook_code("l08-15", "l08-17")
    exec(code["l08-15"], namespace)                              # step 1: rows_serial, step1
    exec(code["l08-17"], namespace)                              # step 2: rows_parallel, step2
    flat = (code["l08-17"].replace("@numba.njit(parallel=True)", "@numba.njit").replace("numba.prange", "range")
            .replace("rows_parallel", "rows_flat").replace("def step2", "def step2_flat"))
    exec(flat, namespace)
    q, k, v = (np.random.default_rng(seed).standard_normal(PRANGE_SHAPE).astype(np.float32) for seed in range(3))
    threads = numba.get_num_threads()

    def on_threads(n, forward):
        def call():
            numba.set_num_threads(n)
            try:
                call_forward(forward, q, k, v)
            finally:
                numba.set_num_threads(threads)
        return call
    contenders = {"step 1": on_threads(1, namespace["step1"]),
                  "step 2, 1 thread": on_threads(1, namespace["step2"]),
                  f"step 2, {threads} threads": on_threads(threads, namespace["step2"]),
                  "step 2's body, range, no prange": on_threads(1, namespace["step2_flat"])}
    times, loads = rounds_of(contenders, rounds)
    return {"shape": list(PRANGE_SHAPE), "threads": threads, "rounds_s": times, "load_1min": loads,
            "min_s": {name: min(t) for name, t in times.items()},
            "what": "the notebook's step 1 and step 2 (cells l08-15, l08-17), float32 inputs, fastest of the rounds; "
                    "step 2's body with range in a plain njit isolates the flat row index and the per-row o"}


def part_dot(rounds):
    import numba

    from course_lib.kernels import cpu_steps

    def dot_loop(a, b):                                          # section 2's loop, as the chapter writes it
        total = 0.0
        for i in range(a.shape[0]):
            total += a[i] * b[i]
        return total

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1_000_000), rng.standard_normal(1_000_000)
    plain, fast = numba.njit(dot_loop), numba.njit(fastmath=cpu_steps.FASTMATH)(dot_loop)
    blas = numpy_openblas()
    blas_threads = blas[1]() if blas else None

    def np_dot_on(n):
        def call():
            blas[0](n)
            try:
                np.dot(a, b)
            finally:
                blas[0](blas_threads)
        return call
    contenders = {"njit loop": lambda: plain(a, b), "njit loop, FASTMATH": lambda: fast(a, b),
                  "np.dot": lambda: np.dot(a, b)}
    if blas:
        contenders["np.dot, 1 thread"] = np_dot_on(1)
    times, loads = rounds_of(contenders, rounds)
    return {"n": a.size, "dtype": "float64", "blas_threads": blas_threads, "rounds_s": times, "load_1min": loads,
            "min_s": {name: min(t) for name, t in times.items()},
            "bytes_read": a.nbytes + b.nbytes,
            "what": "dot of two float64 vectors of 10**6 (16 MB, inside the L3 once read), fastest of the rounds"}


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# glibc's malloc with no mmap and no trimming: a freed block stays in the heap, its pages touched, and the
# next large array reuses them, where by default each large array is a fresh mapping, faulted in and zeroed
REUSED_PAGES_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)}


def naive_worker(calls=3):
    """Naive attention at NAIVE_SHAPE in this process: the fastest of ``calls`` after one to warm up, and the
    minor page faults of the last call."""
    import course_lib
    q, k, v = (np.random.default_rng(seed).standard_normal(NAIVE_SHAPE, dtype=np.float32) for seed in range(3))
    course_lib.attention(q, k, v, impl="naive")
    times = []
    for _ in range(calls):
        before, start = minor_faults(), time.perf_counter()
        course_lib.attention(q, k, v, impl="naive")
        times.append(time.perf_counter() - start)
        faults = minor_faults() - before
    print(json.dumps({"min_s": min(times), "faults": faults, "load_1min": load_now()}))


def part_pages(rounds):
    import subprocess
    x = np.random.default_rng(0).standard_normal(PAGES_BYTES // 4, dtype=np.float32)
    reused = np.empty_like(x)
    reused[:] = 0                                               # every page touched once, before the rounds

    def fresh():
        out = np.empty_like(x)                                  # a new mapping: no page of it touched yet
        np.exp(x, out=out)

    contenders = {"np.exp into a fresh array": fresh, "np.exp into a touched array": lambda: np.exp(x, out=reused)}
    faults = {}
    for name, call in contenders.items():
        before = minor_faults()
        call()
        faults[name] = minor_faults() - before
    times, loads = rounds_of(contenders, rounds)
    naive = {"naive attention, fresh pages": {}, "naive attention, pages reused": REUSED_PAGES_ENV}
    naive_rounds = {name: [] for name in naive}
    for _ in range(rounds):
        for name, extra in naive.items():
            done = subprocess.run([sys.executable, __file__, "--naive-worker"], env={**os.environ, **extra},
                                  capture_output=True, text=True, check=True)
            naive_rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, results in naive_rounds.items():
        times[name] = [r["min_s"] for r in results]
        faults[name] = results[-1]["faults"]
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return {"bytes": PAGES_BYTES, "naive_shape": list(NAIVE_SHAPE), "rounds_s": times, "load_1min": loads,
            "naive_load_1min": [r["load_1min"] for results in naive_rounds.values() for r in results],
            "min_s": {name: min(t) for name, t in times.items()}, "minor_faults": faults,
            "page_bytes": resource.getpagesize(), "reused_pages_env": REUSED_PAGES_ENV,
            "transparent_hugepage": thp.read_text().strip() if thp.exists() else None,
            "what": "np.exp of 256 MiB of float32 into a fresh and into a touched array (fastest of the rounds), and "
                    "naive attention in worker processes, by default (each large temporary a fresh mapping) and "
                    "with glibc's mmap and trimming off (freed pages reused); minor page faults of one call each"}


def part_simd():
    import llvmlite.binding as llvm
    import numba

    from course_lib.bench import simd
    from course_lib.kernels import cpu_steps
    namespace = {"np": np, "numba": numba, "cpu_steps": cpu_steps}
    exec(notebook_code("l08-s04")["l08-s04"].split("tile_rng =")[0], namespace)   # micro_4x16, as the notebook has it
    # matmul_nt's machine code is cached, which numba does not disassemble: the same source and options,
    # compiled anew
    options = {name: value for name, value in cpu_steps.matmul_nt.targetoptions.items()
               if name not in ("cache", "nopython")}
    matmul_nt = numba.njit(**options)(cpu_steps.matmul_nt.py_func)
    A = np.ones((8, 64), np.float32)
    namespace["micro_4x16"](A, np.ones((1, 64, 16), np.float32), np.empty((8, 16), np.float32))
    matmul_nt(A, A, np.empty((8, 8), np.float32), 8, 8, 64)
    counts = {}
    for name, fn in (("micro_4x16", namespace["micro_4x16"]), ("matmul_nt", matmul_nt)):
        asm = next(iter(fn.inspect_asm().values()))
        counts[name] = simd.fma_table(asm)
    return {"llvm_cpu": llvm.get_host_cpu_name(), "fma": counts,
            "what": "vfmadd / vfmsub / vfnmadd instructions in the machine code LLVM made here, by register width, "
                    "packed or scalar, and whether one operand is memory"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args()
    from course_lib import bench
    env, run = bench.environment(), bench.new_run()
    cpu = env["cpu_identity"]
    print(f"run {run} on {env['cpu']} ({cpu.get('microarchitecture')}, family {cpu.get('family')} "
          f"model {cpu.get('model')}), parts {args.parts}, {args.rounds} rounds")
    measured = {"prange": lambda: part_prange(args.rounds), "dot": lambda: part_dot(args.rounds),
                "pages": lambda: part_pages(args.rounds), "simd": part_simd}
    with bench.RecordFile(args.out, run=run, run_id=run, environment=env) as out:
        for part in args.parts:
            result = measured[part]()
            out.write({"benchmark": f"ch08_{part}", **result})
            shown = result.get("min_s", result.get("fma"))
            print(f"  {part}: {json.dumps(shown)}" + (f" (load {min(result['load_1min']):.1f}-"
                                                      f"{max(result['load_1min']):.1f})" if "load_1min" in result else ""))
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--naive-worker"]:
        naive_worker()
    else:
        main()
