"""Where the conversion sits (chapter 11): float8 / float16 K converted in the hot loop, per tile, or once.

    .venv/bin/python benchmarks/lowp_conversion.py           # append one run to the records

Times the score loop S = Q K^T of ``course_lib.lowp.conversion`` with K in
float32 (converted once before, the conversion timed with it), K decoded per
tile, and K decoded at every use, for float8_e4m3fn and float16 K, in
alternated rounds (one call of each per round, so that the load of a shared
machine hits all alike), and reports min / median / max.  It also measures
what the conversion is weighed against: the time to convert one element
(``decode_all`` over a large array) and this machine's streaming read
bandwidth (a sum over a float32 and a uint8 array larger than the caches).
Appends JSON lines to ``notebooks/records/lowp_conversion.jsonl``.
This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
import statistics
from pathlib import Path

import numba
import numpy as np

from course_lib import bench
from course_lib.lowp import conversion as cv

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "lowp_conversion.jsonl"


@numba.njit(cache=True, fastmath={"reassoc"})
def _stream_sum(x):
    # reassoc: the compiler may split the sum over SIMD lanes, so the loop waits on memory, not on adds
    total = x.dtype.type(0)
    for i in range(x.size):
        total += x[i]
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen-q", type=int, default=256)
    parser.add_argument("--seqlen-k", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-q", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--stream-mib", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    run, env = bench.new_run(), bench.environment()
    rng = np.random.default_rng(0)
    nq, nk, d = args.seqlen_q, args.seqlen_k, args.head_dim
    q = rng.standard_normal((nq, d)).astype(np.float32)
    k = rng.standard_normal((nk, d)).astype(np.float32)
    s = np.empty((nq, nk), np.float32)
    lines = []

    def keep(**fields):
        lines.append({"benchmark": "lowp_conversion", "run": run, "environment": env, **fields})

    for dtype in ("float8_e4m3fn", "float16"):
        low = k.astype(np.dtype(dtype))
        bits, table = cv.as_bits(low), cv.decode_table(low.dtype)
        k32 = np.empty_like(k)

        def once():
            cv.decode_all(bits, table, k32)
            cv.scores_f32(q, k32, s)
        calls = {"float32 K (no conversion)": lambda: cv.scores_f32(q, k, s), "once": once,
                 "tile": lambda: cv.scores_tile(q, bits, table, s, args.block_q, 64),
                 "in_loop": lambda: cv.scores_in_loop(q, bits, table, s)}
        times = bench.interleaved_rounds(calls, args.repeats)
        for place, ts in times.items():
            conversions = 0 if place.startswith("float32") else cv.conversions(nq, nk, d, place, args.block_q)
            keep(kind="place", dtype=dtype, place=place, seqlen_q=nq, seqlen_k=nk, head_dim=d, block_q=args.block_q,
                 conversions=conversions, repeats=args.repeats, **bench.spread(ts, "s"))
            print(f"{dtype:>14} {place:>26}: median {statistics.median(ts) * 1e3:8.2f} ms "
                  f"(min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f}), {conversions} conversions")
        # one conversion, alone: decode a large array
        n = args.stream_mib * 2 ** 20 // 4
        big = rng.standard_normal(n).astype(np.float32).astype(np.dtype(dtype))
        big_bits, out = cv.as_bits(big), np.empty(n, np.float32)
        ts = bench.interleaved_rounds({"decode": lambda: cv.decode_all(big_bits, table, out)}, 5)["decode"]
        keep(kind="decode", dtype=dtype, elements=n, **bench.spread(ts, "s"),
             ns_per_element=statistics.median(ts) / n * 1e9)
        print(f"{dtype:>14} decode: {statistics.median(ts) / n * 1e9:.3f} ns per element")
    n = args.stream_mib * 2 ** 20 // 4
    f32, u8 = rng.standard_normal(n).astype(np.float32), rng.integers(0, 255, 4 * n, dtype=np.uint8)
    ts = bench.interleaved_rounds({"float32": lambda: _stream_sum(f32), "uint8": lambda: _stream_sum(u8)}, 5)
    for name, x in (("float32", f32), ("uint8", u8)):
        keep(kind="stream", array=name, bytes=int(x.nbytes), **bench.spread(ts[name], "s"),
             bandwidth=x.nbytes / statistics.median(ts[name]))
        print(f"stream read {name}: {x.nbytes / statistics.median(ts[name]) / 1e9:.2f} GB/s")
    bench.write_records(args.out, lines)
    print(f"{len(lines)} records appended to {args.out} (run {run})")


if __name__ == "__main__":
    main()
