"""What a core without a matrix unit pays for int8 attention: the same loop, scalar and vectorised.  (chapter 15)

    .venv/bin/python benchmarks/edge_int8.py            # append one run to the records

``course_lib.edge.fixed_point.int8_scores_loop`` is S32 = q8 k8^T written as
loops, one int32 multiply-add per (row, key, dim): what a GPU kernel's MMA
becomes on a core without one.  The script compiles that one source twice, in
two fresh processes: once with LLVM's loop and SLP vectorisers off
(``NUMBA_LOOP_VECTORIZE=0``, ``NUMBA_SLP_VECTORIZE=0``: a scalar core) and once
as Numba normally does (this CPU's vector unit).  The table exp loop
(``exp2_fixed_loop``) is timed the same way, and numpy's float32 matmul (BLAS)
beside them (one thread) as the nearest thing here to a matrix unit.  Min / median / max of
the repeats per mode, in alternated rounds, to
``notebooks/records/edge_int8.jsonl``.  A benchmark, not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "edge_int8.jsonl"
ONE_CORE = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}  # one core, as one NPU core
MODES = {"scalar": {"NUMBA_LOOP_VECTORIZE": "0", "NUMBA_SLP_VECTORIZE": "0"}, "vector": {}}


def child(br, bc, d, repeats):
    """Run in a fresh process: time the loops as this process's Numba compiles them."""
    from course_lib.edge import fixed_point as fp
    rng = np.random.default_rng(15)
    q8, k8 = (rng.integers(-127, 128, (n, d)).astype(np.int8) for n in (br, bc))
    out = np.empty((br, bc), np.int32)
    y = -rng.integers(0, 16 << fp.FRAC, br * bc).astype(np.int64)
    table, p = fp.exp2_table(8), np.empty(br * bc, np.int64)
    fp.int8_scores_loop(q8, k8, out), fp.exp2_fixed_loop(y, table, 8, p)   # compile
    assert np.array_equal(out, fp.scores_int8(q8, k8)) and np.array_equal(p, fp.exp2_fixed(y, 8))
    qf, kf = q8.astype(np.float32), k8.astype(np.float32)
    res = {"scores": [], "exp": [], "blas": []}
    for _ in range(repeats):
        for name, call in (("scores", lambda: fp.int8_scores_loop(q8, k8, out)),
                           ("exp", lambda: fp.exp2_fixed_loop(y, table, 8, p)), ("blas", lambda: qf @ kf.T)):
            start = time.perf_counter()
            call()
            res[name].append(time.perf_counter() - start)
    print(json.dumps(res))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tile", type=int, nargs=3, default=[128, 128, 64], help="Br Bc D")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    br, bc, d = args.tile
    if args.child:
        return child(br, bc, d, args.repeats)
    from course_lib import bench
    run, env = bench.new_run(), bench.environment()
    times = {m: {"scores": [], "exp": [], "blas": []} for m in MODES}
    for r in range(args.rounds):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
            with tempfile.TemporaryDirectory() as cache:   # a fresh cache: each mode compiles its own code
                envvars = {**os.environ, **MODES[mode], "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT),
                           **ONE_CORE}
                result = subprocess.run([sys.executable, __file__, "--child", "--tile", *map(str, args.tile),
                                         "--repeats", str(args.repeats)], env=envvars, capture_output=True,
                                        text=True, check=True)
            for key, values in json.loads(result.stdout.strip().splitlines()[-1]).items():
                times[mode][key] += values
    macs = br * bc * d
    print(f"run {run} on {env['cpu']}: S32 = q8 k8^T of {br}x{d} by {bc}x{d}, and {br * bc} table exps")
    for mode in MODES:
        for key, work, unit in (("scores", macs, "MAC"), ("exp", br * bc, "exp"), ("blas", macs, "MAC")):
            s = bench.spread(times[mode][key])
            bench.append_record(args.out, benchmark="edge_int8", run=run, env=env, impl=f"{key}, {mode}",
                                shape=(1, 1, br, bc, d), dtype="float32" if key == "blas" else "int8",
                                block_q=br, block_k=bc, time_s=s["median"], layer="kernel", mode=mode, loop=key,
                                measured_s=s, work=work, work_unit=unit, tile=[br, bc, d],
                                ns_per_unit=1e9 * s["median"] / work, bytes_moved=(br + bc) * d,
                                bytes_source="the int8 tiles read")
            print(f"  {mode:<7}{key:<8} median {s['median'] * 1e3:8.3f} ms  {1e9 * s['median'] / work:7.3f} ns/{unit}")
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
