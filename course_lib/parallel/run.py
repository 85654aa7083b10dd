"""One distributed attention run: make the inputs, deal the shards, run a strategy on every rank,
put the rows back together and, if asked, check them against the single-process reference.

Every rank draws the same seeded Q, K, V and keeps its own rows, so no rank
has to scatter anything and the parent can check the result with
``course_lib.attention(impl="reference")`` on the same inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import checks
from . import sharding
from .ranks import run_ranks
from .ring import ring_attention
from .shard_attention import shard, unshard
from .ulysses import check_heads, ulysses_attention

STRATEGIES = ("ring", "ulysses")


@dataclass(frozen=True)
class Problem:
    """The attention problem, (B, H, N, D) with heads_k K/V heads, and its seed."""
    batch: int = 1
    heads: int = 4
    seqlen: int = 64
    head_dim: int = 16
    heads_k: int | None = None
    dtype: str = "float32"
    seed: int = 0

    def inputs(self):
        rng = np.random.default_rng(self.seed)
        hk = self.heads if self.heads_k is None else self.heads_k
        q = rng.standard_normal((self.batch, self.heads, self.seqlen, self.head_dim))
        k, v = (rng.standard_normal((self.batch, hk, self.seqlen, self.head_dim)) for _ in range(2))
        return tuple(x.astype(self.dtype) for x in (q, k, v))


@dataclass(frozen=True)
class Job:
    """One strategy to run: ring (with its sharding scheme and overlap on or off) or ulysses."""
    strategy: str = "ring"
    causal: bool = False
    scheme: str = "zigzag"
    overlap: bool = True

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.scheme not in sharding.SCHEMES:
            raise ValueError(f"scheme must be one of {sharding.SCHEMES}, got {self.scheme!r}")

    def layouts(self, seqlen, world_size):
        """Ulysses needs each rank's slice contiguous (the all-to-all joins slices in rank order)."""
        return sharding.layout("contiguous" if self.strategy == "ulysses" else self.scheme, seqlen, world_size)

    def label(self, world_size):
        how = f" ({self.scheme}{'' if self.overlap else ', no overlap'})" if self.strategy == "ring" else ""
        return f"{self.strategy}{how}, {world_size} ranks, {'causal' if self.causal else 'no mask'}"


def rank_job(rank, world_size, device, problem, jobs, impl, repeats):
    """What each rank runs: every job in turn, ``repeats`` rounds (alternated, so a load that comes
    and goes on a shared machine hits every job alike); each job's last result is kept."""
    q, k, v = problem.inputs()
    layouts = [job.layouts(problem.seqlen, world_size) for job in jobs]
    mine = [[shard(x, lay[rank]) for x in (q, k, v)] for lay in layouts]
    states, timings = [None] * len(jobs), [[] for _ in jobs]
    for _ in range(repeats):
        for i, job in enumerate(jobs):
            if job.strategy == "ring":
                states[i], t = ring_attention(*mine[i], layouts[i], causal=job.causal, impl=impl,
                                              overlap=job.overlap, device=device)
            else:
                states[i], t = ulysses_attention(*mine[i], causal=job.causal, impl=impl, device=device)
            timings[i].append(t)
    return [{"out": s[0], "lse": s[1], "timings": t} for s, t in zip(states, timings)]


def run_jobs(jobs, world_size, problem=Problem(), *, impl="flash_numpy", device="cpu", timeout=120.0,
             fault=None, repeats=1, startup_timeout=120.0):
    """Run every job on one group of ``world_size`` ranks (started once); for each job
    (out, lse, per-rank timings), out and lse reassembled in sequence order."""
    for job in jobs:   # bad shapes fail here, not in N ranks
        job.layouts(problem.seqlen, world_size)
        if job.strategy == "ulysses":
            check_heads(problem.heads, problem.heads_k or problem.heads, world_size)
    per_rank = run_ranks(rank_job, world_size, (problem, list(jobs), impl, repeats), device=device,
                         timeout=timeout, fault=fault, startup_timeout=startup_timeout)
    results = []
    for i, job in enumerate(jobs):
        mine = [r[i] for r in per_rank]
        out, lse = unshard([m["out"] for m in mine], [m["lse"] for m in mine],
                           job.layouts(problem.seqlen, world_size))
        results.append((out, lse, [m["timings"] for m in mine]))
    return results


def check(out, lse, problem, *, causal, name):
    """One PASS line when out and lse match the float64 reference (``checks.CheckFailed`` otherwise)."""
    q, k, v = problem.inputs()
    checks.check_attention(out, q, k, v, lse=lse, causal=causal, name=name)
