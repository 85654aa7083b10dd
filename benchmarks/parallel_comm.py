"""Communication of attention across ranks, measured beside the alpha-beta model (chapter 14).

    .venv/bin/python benchmarks/parallel_comm.py            # this machine: gloo, 2 ranks, CPU processes
    .venv/bin/python benchmarks/parallel_comm.py --rounds 9 --seqlens 1024 2048 4096

The 2-GPU run (NCCL, the course's CUDA kernel, torch SDPA as the peer, 32K-256K tokens):

    .venv/bin/python benchmarks/parallel_comm.py --device cuda --world-size 2 \
        --impls flash_numba_cuda torch_sdpa --seqlens 32768 65536 131072 262144 \
        --heads 8 --head-dim 64 --rounds 5 --out notebooks/records/parallel_comm_h200x2.jsonl

Four measurements, all in one run, each appended as JSON lines to
``notebooks/records/parallel_comm.jsonl`` (``kind`` says which):

- ``pingpong``: one-way time of a message of each size between ranks 0 and 1
  (min / median / max over ``--pingpong-repeats``), and ``alpha_beta``: the
  latency alpha and bandwidth beta fitted to the medians;
- ``comm``: for each sequence length, strategy and overlap setting, each
  rank's compute and exposed-communication seconds, min / median / max over
  ``--rounds`` alternated rounds, beside the model's prediction from the
  fitted alpha and beta and the bytes each rank sent;
- ``imbalance``: causal ring with contiguous, zigzag and striped sharding:
  the measured compute imbalance (sum over steps of the slowest rank over the
  mean) beside the counted one (``sharding.step_work``).

This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
from pathlib import Path

import numpy as np

from course_lib import bench
from course_lib.parallel import costmodel, sharding
from course_lib.parallel.ranks import run_ranks
from course_lib.parallel.run import Job, Problem, run_jobs

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "parallel_comm.jsonl"


def per_round(timings, key):
    """For each round, the slowest rank's total of ``key`` (the ring waits for its slowest rank)."""
    rounds = len(timings[0])
    return [max(sum(rank[r][key]) for rank in timings) for r in range(rounds)]


def measured_imbalance(timings):
    """Sum over steps of the slowest rank's compute over the mean, median over rounds."""
    ratios = []
    for r in range(len(timings[0])):
        steps = np.array([rank[r]["compute_s"] for rank in timings]).T   # (steps, ranks)
        ratios.append(sharding.imbalance(steps))
    return bench.spread(ratios)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--impls", nargs="+", default=["flash_numpy"], help="course impls (and torch_sdpa, the peer)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pingpong-sizes", type=int, nargs="+", default=[4 ** i for i in range(2, 13)])
    p.add_argument("--pingpong-repeats", type=int, default=15)
    p.add_argument("--timeout", type=float, default=580.0)
    p.add_argument("--out", type=Path, default=RECORDS)
    a = p.parse_args(argv)
    run, env = bench.new_run(), bench.environment()
    backend = "nccl" if a.device == "cuda" else "gloo"
    base = {"benchmark": "parallel_comm", "run": run, "backend": backend, "world_size": a.world_size,
            "device": a.device, "environment": env}
    rows = []

    pp = run_ranks(costmodel.ping_pong, a.world_size, (a.pingpong_sizes, a.pingpong_repeats),
                   device=a.device, timeout=a.timeout)[0]
    for size, (lo, med, hi) in zip(a.pingpong_sizes, pp):
        rows.append({**base, "kind": "pingpong", "bytes": size, "min_s": lo, "median_s": med, "max_s": hi})
    alpha, beta = costmodel.fit_alpha_beta(a.pingpong_sizes, [m for _, m, _ in pp])
    rows.append({**base, "kind": "alpha_beta", "alpha_s": alpha, "beta_bytes_per_s": beta})
    print(f"run {run}: {backend}, {a.world_size} ranks; alpha = {alpha * 1e6:.1f} us, beta = {beta / 1e9:.2f} GB/s")

    itemsize = np.dtype(a.dtype).itemsize
    for impl in a.impls:
        for n in a.seqlens:
            problem = Problem(1, a.heads, n, a.head_dim, None, a.dtype, 0)
            shape = dict(batch=1, heads=a.heads, heads_k=a.heads, seqlen=n, head_dim=a.head_dim,
                         world_size=a.world_size, itemsize=itemsize)
            jobs = [Job("ring", False, "contiguous", overlap=True), Job("ring", False, "contiguous", overlap=False),
                    Job("ulysses", False)]
            imbalance_jobs = [Job("ring", True, s) for s in sharding.SCHEMES]
            results = run_jobs(jobs + imbalance_jobs, a.world_size, problem, impl=impl, device=a.device,
                               timeout=a.timeout, repeats=a.rounds + 1)
            results = [(o, l, [rank[1:] for rank in t]) for o, l, t in results]   # round 0 warms up
            if impl == a.impls[0]:
                for strategy in ("ring", "ulysses"):
                    per_rank = run_ranks(costmodel.comm_pattern, a.world_size,
                                         (strategy, {k: v for k, v in shape.items() if k != "world_size"},
                                          a.rounds), device=a.device, timeout=a.timeout)
                    measured = [max(rank[r] for rank in per_rank) for r in range(a.rounds)]
                    sent = costmodel.ring_bytes(**shape) if strategy == "ring" else costmodel.ulysses_bytes(**shape)
                    row = {**base, "kind": "comm", "strategy": strategy, "seqlen": n, "heads": a.heads,
                           "head_dim": a.head_dim, "dtype": a.dtype, "rounds": a.rounds,
                           "bytes_sent_per_rank": sent, "messages_per_rank": costmodel.messages(strategy, a.world_size),
                           "predicted_comm_s": costmodel.predict(strategy, alpha, beta, **shape),
                           "measured_comm_s": bench.spread(measured)}
                    rows.append(row)
                    print(f"N={n:>6} {strategy:>8}: {sent / 1e6:8.3f} MB in {row['messages_per_rank']} messages, "
                          f"predicted {row['predicted_comm_s'] * 1e3:8.3f} ms, measured median "
                          f"{row['measured_comm_s']['median'] * 1e3:8.3f} ms (min {row['measured_comm_s']['min'] * 1e3:.3f})")
            for job, (_, _, timings) in zip(jobs, results):
                row = {**base, "kind": "overlap", "impl": impl, "strategy": job.strategy, "overlap": job.overlap,
                       "seqlen": n, "heads": a.heads, "head_dim": a.head_dim, "dtype": a.dtype, "rounds": a.rounds,
                       "compute_s": bench.spread(per_round(timings, "compute_s")),
                       "exposed_comm_s": bench.spread(per_round(timings, "wait_s")),
                       "wall_s": bench.spread([max(rank[r]["wall_s"] for rank in timings) for r in range(a.rounds)])}
                rows.append(row)
                print(f"{impl:>16} N={n:>6} {job.label(a.world_size):<42} compute "
                      f"{row['compute_s']['median'] * 1e3:8.2f} ms, exposed comm {row['exposed_comm_s']['median'] * 1e3:8.2f}"
                      f" ms, wall "
                      f"{row['wall_s']['median'] * 1e3:8.2f} ms")
            for job, (_, _, timings) in zip(imbalance_jobs, results[len(jobs):]):
                counted = sharding.imbalance(sharding.step_work(job.scheme, n, a.world_size, causal=True))
                row = {**base, "kind": "imbalance", "impl": impl, "scheme": job.scheme, "seqlen": n,
                       "heads": a.heads, "head_dim": a.head_dim, "dtype": a.dtype, "rounds": a.rounds,
                       "counted_imbalance": counted, "measured_imbalance": measured_imbalance(timings),
                       "wall_s": bench.spread([max(rank[r]["wall_s"] for rank in timings) for r in range(a.rounds)])}
                rows.append(row)
                print(f"{impl:>16} N={n:>6} causal ring, {job.scheme:<10}: imbalance counted {counted:.3f}, "
                      f"measured {row['measured_imbalance']['median']:.3f}, wall {row['wall_s']['median'] * 1e3:.2f} ms")
    bench.write_records(a.out, rows)
    print(f"appended {len(rows)} records to {a.out}")


if __name__ == "__main__":
    main()
