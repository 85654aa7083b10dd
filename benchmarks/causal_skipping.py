"""How much does skipping empty tiles buy a causal kernel?  (chapter 06)

    .venv/bin/python benchmarks/causal_skipping.py            # append one run to the records
    .venv/bin/python benchmarks/causal_skipping.py --sizes 512 1024

Times ``flash_numpy`` with and without a causal mask at Nq = Nk, in the same
run, and appends one record per measurement to
``notebooks/records/causal_skipping.jsonl``, where chapter 06 plots them.  It
prints the measured ratio (non-causal time / causal time) next to what the
tile counts predict: causal computes ``work_fraction`` of the tiles, so a kernel
whose time is all in the tiles would be 1 / work_fraction times faster.

This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
from functools import partial
from pathlib import Path

import numpy as np

import course_lib
from course_lib import bench
from course_lib.core.masks import MaskSpec
from course_lib.kernels import flash_numpy
from course_lib.views.tilemap import tile_counts

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "causal_skipping.jsonl"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096], help="Nq = Nk")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=64, help="block_q = block_k")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)

    run, env = bench.new_run(), bench.environment()
    rng = np.random.default_rng(0)
    B, H, D, Bq = args.batch, args.heads, args.head_dim, args.block
    print(f"run {run} on {env['cpu']} ({env['cpu_cores']['usable']} cores), flash_numpy, "
          f"B={B} H={H} D={D} {args.dtype}, tiles {Bq}x{Bq}, median of {args.repeats}, interleaved")
    print(f"{'N':>6} {'full (s)':>9} {'causal (s)':>10} {'measured ratio':>15} {'tiles computed':>15} {'1/work':>7}")
    for n in args.sizes:
        q, k, v = (rng.standard_normal((B, H, n, D)).astype(args.dtype) for _ in range(3))
        run_it = {causal: partial(course_lib.attention, q, k, v, impl="flash_numpy", causal=causal,
                                  block_q=Bq, block_k=Bq) for causal in (False, True)}
        # interleaved: one full and one causal call per round, so load on the machine hits both
        times = bench.time_interleaved(run_it, repeats=args.repeats, warmup=args.warmup)
        for causal in (False, True):
            _, _, stats = flash_numpy.run_with_stats(q, k, v, causal=causal, block_q=Bq, block_k=Bq)  # one call
            counts = tile_counts(MaskSpec(n, n, causal=causal), Bq, Bq)
            bench.append_record(
                args.out, benchmark="causal_skipping", run=run, env=env, impl="flash_numpy",
                shape=(B, H, n, n, D), dtype=args.dtype, causal=causal, block_q=Bq, block_k=Bq,
                time_s=times[causal], bytes_moved=stats.hbm_bytes,
                bytes_source="counted by flash_numpy (TileStats)", repeats=args.repeats, warmup=args.warmup,
                tiles_computed=stats.computed, tiles_skipped=stats.skipped, tiles_masked=stats.masked,
                work_fraction=counts.work_fraction)
        print(f"{n:>6} {times[False]:>9.4f} {times[True]:>10.4f} {times[False] / times[True]:>14.2f}x "
              f"{100 * counts.work_fraction:>14.1f}% {1 / counts.work_fraction:>6.2f}x")
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
