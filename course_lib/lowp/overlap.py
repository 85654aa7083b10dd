"""FlashAttention-3's overlap as a schedule you can check: one thread block's main loop, simulated.

Each key tile j costs four stages: LOAD (the producer's TMA copies of K_j and
V_j into shared memory, half the load time each), GEMM0 (S = Q K_j^T on the tensor cores), SOFTMAX (the
online softmax on the warps' own ALUs and special-function units) and GEMM1
(O += P V_j, tensor cores).  Resources: one copy engine ("tma"), one set of
tensor cores ("tc", shared by the block's warpgroups), and each consumer
warpgroup's own ALUs ("alu0", "alu1").  A schedule is a list of operations
with dependencies; ``simulate`` starts each as soon as its dependencies are
done and its resource is free, in list order per resource (the order the
code issues them), and returns the timeline.

Schedules (FA3, section 3.1 and 3.2):

- ``serial``: one warpgroup does everything in turn, loads included (no
  asynchronous copy);
- ``async_loads``: a producer warp loads ahead into ``stages`` buffers (TMA,
  warp specialisation); the consumer still runs GEMM0, softmax, GEMM1 in turn;
- ``intra``: intra-warpgroup pipelining: GEMM1 of tile j-1 is issued after
  GEMM0 of tile j and runs while tile j's softmax does;
- ``pingpong``: two consumer warpgroups, each on its own query tile: one's
  softmax runs while the other's GEMMs use the tensor cores;
- ``pingpong_intra``: both (what FA3 ships).

``tc_busy`` is the fraction of the time the tensor cores work.  The stage
costs come from ``stage_costs``: matmul and exponential rates per SM from the
datasheet and FA3's paper, the load from the H200's measured bandwidth
(``core.hardware``, each figure with its source).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.hardware import hardware

SCHEDULES = ("serial", "async_loads", "intra", "pingpong", "pingpong_intra")

# FA3's published numbers (Shah et al. 2024, arXiv:2407.08608), on an H100 SXM5, FP16 forward,
# head dim 128: the abstract's FA2 -> FA3 range, and table 2's ablation (non-causal, seqlen 8K).
PUBLISHED = {
    "fa3_vs_fa2_speedup": (1.5, 2.0),         # abstract: "speedup on H100 GPUs by 1.5-2.0x with FP16"
    "fa3_peak_tflops": 740,                   # abstract: "reaching up to 740 TFLOPs/s (75% utilization)"
    "fa2_utilization": 0.35,                  # abstract: FlashAttention-2 "achieving only 35% utilization on the H100"
    # table 2 (BF16, head dim 128, seqlen 8K): FlashAttention-3; no GEMM-softmax pipelining with
    # warp specialization; GEMM-softmax pipelining without warp specialization
    "ablation_tflops": {"pingpong_intra": 661, "pingpong": 582, "intra": 570},
    # the rows as table 2 names them: warp specialisation is the producer / consumer split (which the
    # ping-pong between consumer warpgroups needs); GEMM-softmax pipelining is the intra-warpgroup overlap
    "ablation_rows": {"pingpong_intra": "FlashAttention-3",
                      "pingpong": "no GEMM-softmax pipelining, with warp specialization",
                      "intra": "GEMM-softmax pipelining, no warp specialization"},
}
PUBLISHED_SOURCE = "Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608): abstract and table 2"


@dataclass(frozen=True)
class Op:
    name: str          # "load K", "load V", "gemm0", "softmax", "gemm1"
    wg: int            # consumer warpgroup (the producer's loads carry the warpgroup they feed)
    j: int             # key tile
    resource: str
    duration: float
    deps: tuple        # indices of ops that must finish first


@dataclass(frozen=True)
class Span:
    op: Op
    start: float
    end: float


def stage_costs(hw="h200", *, block_q=128, block_k=128, head_dim=128, dtype="float16", softmax_ops=1.0,
                kv_sharing=64, bandwidth_source="measured"):
    """Seconds per stage of one key tile on one SM: {"load", "gemm0", "softmax", "gemm1"}.

    GEMMs: 2 Br Bc d FLOPs each at the dtype's tensor-core peak / SMs;
    softmax: Br Bc exponentials at the special-function rate / SMs, times
    ``softmax_ops`` (1: the exponentials alone, FA3's own estimate);
    load: K_j and V_j (2 Bc d elements) at the memory bandwidth / SMs, the
    tile coming from DRAM once for ``kv_sharing`` thread blocks that read it at
    about the same time (the others hit L2).  64 is an assumption, not a
    measurement: the query tiles of one head at N = 8K, Br = 128, which run
    side by side.  With 1 every block reads DRAM and the loop is load-bound.
    """
    hw = hardware(hw)
    sms = float(hw.units)
    flops = hw.peak(dtype) / sms
    gemm = 2 * block_q * block_k * head_dim / flops
    softmax = softmax_ops * block_q * block_k / (float(hw.exp_per_s) / sms)
    nbytes = 2 * block_k * head_dim * {"float8_e4m3fn": 1}.get(dtype, 2)
    load = nbytes / kv_sharing / (hw.memory_bandwidth(bandwidth_source) / sms)
    return {"load": load, "gemm0": gemm, "softmax": softmax, "gemm1": gemm}


def build(schedule, costs, n_tiles, stages=2):
    """The ops of ``schedule`` over ``n_tiles`` key tiles (per warpgroup), in issue order."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    ops = []
    index = {}

    def add(name, wg, j, resource, deps):
        index[name, wg, j] = len(ops)
        duration = costs["load"] / 2 if name.startswith("load") else costs[name]  # K_j and V_j: half each
        ops.append(Op(name, wg, j, resource, duration, tuple(d for d in deps if d is not None)))

    def at(name, wg, j):
        return index.get((name, wg, j))

    groups = (0, 1) if schedule.startswith("pingpong") else (0,)
    intra = schedule in ("intra", "pingpong_intra")
    for j in range(n_tiles):
        if schedule == "serial":         # the consumer loads its own tiles, then computes
            add("load K", 0, j, "alu0", [at("gemm1", 0, j - 1)])
            add("load V", 0, j, "alu0", [at("load K", 0, j)])
        else:                            # the producer runs ahead into `stages` buffers of K and of V,
            # one load for every group; K_j's buffer is free once GEMM0 read it, V_j's once GEMM1 did
            add("load K", 0, j, "tma", [at("load V", 0, j - 1)] + [at("gemm0", wg, j - stages) for wg in groups])
            add("load V", 0, j, "tma", [at("load K", 0, j)] + [at("gemm1", wg, j - stages) for wg in groups])
        for wg in groups:
            alu = f"alu{wg}"
            if intra:                    # GEMM0 of j, then GEMM1 of j-1 beside softmax of j
                add("gemm0", wg, j, "tc", [at("load K", 0, j), at("softmax", wg, j - 1)])
                if j > 0:
                    add("gemm1", wg, j - 1, "tc", [at("softmax", wg, j - 1), at("gemm0", wg, j), at("load V", 0, j - 1)])
                add("softmax", wg, j, alu, [at("gemm0", wg, j), at("softmax", wg, j - 1)])
            else:
                add("gemm0", wg, j, "tc", [at("load K", 0, j), at("gemm1", wg, j - 1),
                                           at("load V", 0, j) if schedule == "serial" else None])
                add("softmax", wg, j, alu, [at("gemm0", wg, j)])
                add("gemm1", wg, j, "tc", [at("softmax", wg, j), at("load V", 0, j)])
    if intra:
        for wg in groups:
            add("gemm1", wg, n_tiles - 1, "tc", [at("softmax", wg, n_tiles - 1), at("gemm0", wg, n_tiles - 1),
                                                 at("load V", 0, n_tiles - 1)])
    return ops


def simulate(ops):
    """The spans: again and again, of the ops whose dependencies are done, start the one that can
    start first (its dependencies done and its resource free).

    A warpgroup's own order is in the dependencies.  Between warpgroups the
    tensor cores go to whichever is ready first, and on a tie to the one that
    had them last, so that a warpgroup's GEMM1 and its next GEMM0 run back to
    back while the other does its softmax: what FA3's barriers between the two
    warpgroups arrange.  Remaining ties go in issue order.
    """
    free, last_group = {}, {}
    end = [None] * len(ops)
    spans = [None] * len(ops)
    waiting = list(range(len(ops)))
    while waiting:
        best, best_key = None, None
        for i in waiting:
            op = ops[i]
            if any(end[d] is None for d in op.deps):
                continue
            start = max([free.get(op.resource, 0.0)] + [end[d] for d in op.deps])
            key = (start, op.wg != last_group.get(op.resource, op.wg), i)
            if best is None or key < best_key:
                best, best_key = i, key
        op = ops[best]
        end[best] = best_key[0] + op.duration
        free[op.resource], last_group[op.resource] = end[best], op.wg
        spans[best] = Span(op, best_key[0], end[best])
        waiting.remove(best)
    return spans


def makespan(spans) -> float:
    return max(s.end for s in spans)


def tc_busy(spans) -> float:
    """The share of the run the tensor cores are busy."""
    return sum(s.end - s.start for s in spans if s.op.resource == "tc") / makespan(spans)


def run(schedule, costs, n_tiles=16, stages=2) -> dict:
    """{"time", "tc_busy", "spans", "per_tile"} of one schedule; per_tile: the time per (key tile,
    warpgroup) pair, the unit of work, so schedules with one and two warpgroups compare."""
    spans = simulate(build(schedule, costs, n_tiles, stages))
    groups = 2 if schedule.startswith("pingpong") else 1
    return {"time": makespan(spans), "tc_busy": tc_busy(spans), "spans": spans,
            "per_tile": makespan(spans) / (n_tiles * groups)}


def steady_state(schedule, costs) -> float:
    """``run``'s per_tile in the long run (``run`` tends to it as tiles grow), without simulating:
    the time per tile of whatever the schedule waits on most, a shared resource (the copy engine,
    whose one load of a tile feeds both groups of a ping-pong, or the tensor cores) or one
    warpgroup's own chain of stages in the order the schedule allows (its loads too, where it
    loads its own tiles)."""
    L, G0, S, G1 = (costs[k] for k in ("load", "gemm0", "softmax", "gemm1"))
    per_tile = {"serial": L + G0 + S + G1, "async_loads": max(L, G0 + S + G1), "intra": max(L, G0 + max(G1, S)),
                "pingpong": max(L / 2, G0 + G1, (G0 + S + G1) / 2),
                "pingpong_intra": max(L / 2, G0 + G1, (G0 + max(G1, S)) / 2)}
    if schedule not in per_tile:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return per_tile[schedule]
