"""Chapter 14's figures: who owns which part of the causal triangle, and communication measured
beside the alpha-beta model."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from . import costmodel, sharding


def plot_sharding(seqlen=16, world_size=4, schemes=sharding.SCHEMES):
    """Top: the causal (query, key) pairs coloured by the rank that computes them; bottom: the pairs
    each rank computes at each ring step (the ring waits for the largest in each row)."""
    fig, axes = plt.subplots(2, len(schemes), figsize=(3.3 * len(schemes), 6.4), squeeze=False)
    cmap = plt.get_cmap("tab10", world_size)
    for col, scheme in enumerate(schemes):
        pieces = sharding.layout(scheme, seqlen, world_size)
        owner = np.empty(seqlen, dtype=int)
        for rank, p in enumerate(pieces):
            owner[sharding.positions(p)] = rank
        grid = np.where(np.tril(np.ones((seqlen, seqlen), bool)), owner[:, None], np.nan)
        ax = axes[0, col]
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=world_size - 0.5, interpolation="nearest")
        ax.set_title(f"{scheme}: rank of each query row")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        work = sharding.step_work(scheme, seqlen, world_size, causal=True)
        ax = axes[1, col]
        ax.imshow(work, cmap="Greys", vmin=0, vmax=work.max(), aspect="auto")
        for (step, rank), n in np.ndenumerate(work):
            ax.text(rank, step, str(n), ha="center", va="center", fontsize=9,
                    color="white" if n > 0.6 * work.max() else "black")
        ax.set_title(f"pairs per step, imbalance {sharding.imbalance(work):.2f}")
        ax.set_xlabel("rank")
        ax.set_ylabel("ring step")
        ax.set_xticks(range(world_size))
        ax.set_yticks(range(world_size))
        ax.grid(False)
        axes[0, col].grid(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(r)) for r in range(world_size)]
    axes[0, -1].legend(handles, [f"rank {r}" for r in range(world_size)], loc="upper left",
                       bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def plot_alpha_beta(records):
    """Left: ping-pong one-way time against message size, with the fitted alpha + m / beta;
    right: each strategy's communication, measured alone, against the model's prediction."""
    pings = sorted((r for r in records if r["kind"] == "pingpong"), key=lambda r: r["bytes"])
    fit = next(r for r in records if r["kind"] == "alpha_beta")
    comm = [r for r in records if r["kind"] == "comm"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    m = np.array([r["bytes"] for r in pings], float)
    med = np.array([r["median_s"] for r in pings])
    lo, hi = np.array([r["min_s"] for r in pings]), np.array([r["max_s"] for r in pings])
    left.errorbar(m, med * 1e6, yerr=[(med - lo) * 1e6, (hi - med) * 1e6], fmt="o", capsize=3,
                  label="measured (median, min-max)")
    left.plot(m, (fit["alpha_s"] + m / fit["beta_bytes_per_s"]) * 1e6, "-",
              label=f"alpha {fit['alpha_s'] * 1e6:.0f} us + m / {fit['beta_bytes_per_s'] / 1e9:.2f} GB/s")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("message size m (bytes)")
    left.set_ylabel("one-way time (us)")
    left.set_title(f"ping-pong, {fit['backend']}")
    left.legend(loc="upper center")
    for strategy, marker in (("ring", "o"), ("ulysses", "s")):
        rows = sorted((r for r in comm if r["strategy"] == strategy), key=lambda r: r["seqlen"])
        if not rows:
            continue
        n = [r["seqlen"] for r in rows]
        med = np.array([r["measured_comm_s"]["median"] for r in rows]) * 1e3
        lo = np.array([r["measured_comm_s"]["min"] for r in rows]) * 1e3
        hi = np.array([r["measured_comm_s"]["max"] for r in rows]) * 1e3
        line = right.errorbar(n, med, yerr=[med - lo, hi - med], fmt=marker, capsize=3,
                              label=f"{strategy}, measured")
        right.plot(n, [r["predicted_comm_s"] * 1e3 for r in rows], "--", color=line[0].get_color(),
                   label=f"{strategy}, alpha-beta model")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("sequence length N")
    right.set_ylabel("communication per rank (ms)")
    right.set_title("communication alone: model and measurement")
    right.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def plot_strategy_bytes(world_sizes=(2, 4, 8, 16), heads=32, heads_k=32, seqlen=131072, head_dim=128, itemsize=2):
    """Bytes and messages each rank sends, ring against Ulysses, as the world grows."""
    shape = dict(batch=1, heads=heads, heads_k=heads_k, seqlen=seqlen, head_dim=head_dim, itemsize=itemsize)
    ring = [costmodel.ring_bytes(world_size=w, **shape) / 1e9 for w in world_sizes]
    uly = [costmodel.ulysses_bytes(world_size=w, **shape) / 1e9 for w in world_sizes]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(world_sizes, ring, "o-", label="ring: K, V shards, W - 1 times")
    left.plot(world_sizes, uly, "s-", label="Ulysses: q, k, v, out once")
    left.set_xscale("log", base=2)
    left.set_xlabel("ranks W")
    left.set_ylabel("GB sent per rank")
    left.set_title(f"N = {seqlen}, H = {heads}, D = {head_dim}, 2-byte elements")
    left.legend(loc="upper left")
    right.plot(world_sizes, [costmodel.messages("ring", w) for w in world_sizes], "o-", label="ring")
    right.plot(world_sizes, [costmodel.messages("ulysses", w) for w in world_sizes], "s-", label="Ulysses")
    right.set_xscale("log", base=2)
    right.set_xlabel("ranks W")
    right.set_ylabel("messages sent per rank (each costs alpha)")
    right.legend(loc="upper left")
    fig.tight_layout()
    return fig
