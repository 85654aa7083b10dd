"""python -m course_lib.parallel --world-size N --strategy ring|ulysses [--causal] [--check]

Starts N ranks (spawned processes, gloo on the CPU, NCCL with --device cuda),
runs one attention strategy across them and, with --check, prints a PASS line
when out and lse match the single-process reference.  Exit code 0 on success,
1 on a failed check, 2 when a rank fails or times out.
"""
from __future__ import annotations

import argparse
import sys

from .. import checks
from .ranks import FAULTS, RankFailed, RankTimeout
from .run import STRATEGIES, Job, Problem, check, run_jobs
from .sharding import SCHEMES


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m course_lib.parallel", description=__doc__.split("\n\n")[1])
    p.add_argument("--world-size", type=int, required=True, help="number of ranks (processes)")
    p.add_argument("--strategy", choices=STRATEGIES, required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--check", action="store_true", help="compare out and lse with the reference; print PASS")
    p.add_argument("--scheme", choices=SCHEMES, default="zigzag", help="ring sharding (default zigzag)")
    p.add_argument("--no-overlap", action="store_true", help="ring: transfer after compute, not during it")
    p.add_argument("--impl", default="flash_numpy", help="the course impl each rank runs (default flash_numpy)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: NCCL, one GPU a rank")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--heads-k", type=int, default=None)
    p.add_argument("--seqlen", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the whole run is stopped")
    p.add_argument("--fault", choices=FAULTS, help="make one rank fail on purpose (drill)")
    p.add_argument("--fault-rank", type=int, default=1)
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    problem = Problem(a.batch, a.heads, a.seqlen, a.head_dim, a.heads_k, a.dtype, a.seed)
    job = Job(a.strategy, a.causal, a.scheme, not a.no_overlap)
    what = job.label(a.world_size)
    try:
        [(out, lse, timings)] = run_jobs([job], a.world_size, problem, impl=a.impl, device=a.device,
                                         timeout=a.timeout, fault=(a.fault, a.fault_rank) if a.fault else None)
    except (RankFailed, RankTimeout, ValueError) as e:
        print(f"ERROR {what}: {e}", file=sys.stderr)
        return 2
    wall = max(t[-1]["wall_s"] for t in timings)
    print(f"{what}: B={a.batch} H={a.heads} N={a.seqlen} D={a.head_dim} {a.dtype}, impl {a.impl}, "
          f"slowest rank {wall * 1e3:.1f} ms")
    if a.check:
        try:
            check(out, lse, problem, causal=a.causal, name=what)
        except checks.CheckFailed:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
