"""Does double buffering hide the DMA as the schedule model says?  (chapter 15)

    .venv/bin/python benchmarks/edge_dma.py                 # append one run to the records
    .venv/bin/python benchmarks/edge_dma.py --bandwidth 12.5e6 25e6 --rounds 7

This CPU stands in for an NPU (``course_lib.edge.dma``): a paced copy is the
DRAM and its DMA, preallocated buffers the scratchpad, a loader thread the DMA
engine and a compiled, GIL-free tile loop the compute unit.  One query tile
(Br rows) streams every key tile of K and V through 1, 2 and 3 buffers.  Each
round first times one load and one compute alone (``measure_parts``), which is
what the model is given, then runs the three buffer counts in turn (a
different order each round, so the machine's load falls on all of them), and
replays the pipeline's own step times through the model with no hand-off
cost (``replay_s``): measured - replay is what handing a buffer between two
threads cost, replay - model what running the two at once slowed each step.

One record per (bandwidth, buffers) to ``notebooks/records/edge_dma.jsonl``:
fields ``buffers``, ``measured_s``, ``model_s``, ``replay_s`` (each min / median /
max over the rounds: the machine is shared), ``tile``, ``bytes`` (DRAM bytes of
one pipeline), ``parts`` and ``environment``.  This is a benchmark, not a test.
"""
import argparse
import time
from pathlib import Path

import numpy as np

import course_lib
from course_lib import bench
from course_lib.edge import dma, schedule

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "edge_dma.jsonl"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bandwidth", type=float, nargs="+", default=[12.5e6, 25e6], help="DRAM B/s")
    parser.add_argument("--setup", type=float, default=50e-6, help="seconds per DMA transfer before data moves")
    parser.add_argument("--block-q", type=int, default=256)
    parser.add_argument("--block-k", type=int, default=512)
    parser.add_argument("--seqlen-k", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)

    run, env = bench.new_run(), bench.environment()
    rng = np.random.default_rng(15)
    br, bc, nk, d = args.block_q, args.block_k, args.seqlen_k, args.head_dim
    q = rng.standard_normal((br, d)).astype(np.float32)
    k, v = (rng.standard_normal((nk, d)).astype(np.float32) for _ in range(2))
    expected = course_lib.attention(q[None, None].astype(np.float64), k[None, None].astype(np.float64),
                                    v[None, None].astype(np.float64))[0, 0]
    dma.run_pipeline(q, k[:bc], v[:bc], block_k=bc, buffers=1, dram=dma.PacedDRAM(1e12))  # compile
    moved = q.nbytes + k.nbytes + v.nbytes + br * d * 4
    print(f"run {run} on {env['cpu']} ({env['cpu_cores']['usable']} cores usable): one query tile of {br} rows, "
          f"{nk // bc} key tiles of {bc}, D={d}, float32, {args.rounds} rounds")
    for bandwidth in args.bandwidth:
        dram = dma.PacedDRAM(bandwidth, args.setup)
        measured, model, replay, parts_seen = {b: [] for b in (1, 2, 3)}, {b: [] for b in (1, 2, 3)}, \
            {b: [] for b in (1, 2, 3)}, []
        for r in range(args.rounds):
            parts = dma.measure_parts(q, k, v, block_k=bc, dram=dram)
            parts_seen.append(parts)
            for b in np.roll([1, 2, 3], r):
                b = int(b)
                start = time.perf_counter()
                out, _, timeline = dma.run_pipeline(q, k, v, block_k=bc, buffers=b, dram=dram)
                measured[b].append(time.perf_counter() - start)
                if not np.allclose(out, expected, atol=1e-4):
                    raise AssertionError("the pipeline's output differs from the reference")
                model[b].append(schedule.predicted_time(parts["key_tiles"], parts["load_s"], parts["compute_s"], b,
                                                        prologue_s=parts["q_load_s"], epilogue_s=parts["o_store_s"]))
                steps = {kind: [s.end - s.start for s in timeline.steps if s.kind == kind and s.tile >= 0]
                         for kind in (schedule.LOAD, schedule.COMPUTE)}
                ends = [s.end - s.start for s in timeline.steps if s.tile < 0]
                replay[b].append(schedule.simulate(steps[schedule.LOAD], steps[schedule.COMPUTE], b,
                                                   prologue_s=ends[0], epilogue_s=ends[-1]).total)
        print(f"bandwidth {bandwidth / 1e6:g} MB/s: load {np.median([p['load_s'] for p in parts_seen]) * 1e3:.2f} ms, "
              f"compute {np.median([p['compute_s'] for p in parts_seen]) * 1e3:.2f} ms per key tile")
        print(f"  {'buffers':>7} {'measured (s)':>22} {'model (s)':>10} {'replay (s)':>10} {'measured/model':>15}")
        for b in (1, 2, 3):
            m, p, rp = bench.spread(measured[b]), bench.spread(model[b]), bench.spread(replay[b])
            bench.append_record(
                args.out, benchmark="edge_dma", run=run, env=env, impl=f"paced DMA, {b} buffer(s)",
                shape=(1, 1, br, nk, d), dtype="float32", block_q=br, block_k=bc, time_s=m["median"],
                bytes_moved=moved, bytes_source="DRAM bytes of the pipeline: Q, K, V read, O and lse written",
                layer="end to end", buffers=b, measured_s=m, model_s=p, replay_s=rp, tile=[br, bc, d], bytes=moved,
                bandwidth=bandwidth, dma_setup_s=args.setup, rounds=args.rounds,
                parts={key: bench.spread([pp[key] for pp in parts_seen]) for key in
                       ("load_s", "compute_s", "q_load_s", "o_store_s")})
            print(f"  {b:>7} {m['min']:>7.3f} {m['median']:>7.3f} {m['max']:>7.3f} {p['median']:>10.3f} "
                  f"{rp['median']:>10.3f} {m['median'] / p['median']:>14.2f}x")
    print(f"records appended to {args.out}")


if __name__ == "__main__":
    main()
