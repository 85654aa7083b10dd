"""The regression matrix: shape buckets over three paths, recorded and compared with the last run.

    python -m course_lib.bench --matrix --quick                  # this machine, small lengths
    python -m course_lib.bench --matrix --compare notebooks/records/matrix_cpu.jsonl

A number without a regression record is only a demo.  The matrix measures the
same problems every time, bucketed by shape the way a service sees them:

- workloads: ``chat`` (N = 1K) and ``summarise`` (N = 32K; ``--quick``: 128 and
  1024, the summarise length still 8x the chat one);
- kinds: ``prefill`` (Nq = Nk = N) and ``decode`` (Nq = 1 against a cache of N);
- precisions float32, float16, bfloat16; masks none, causal and a sliding window
  of N / 8 keys (``window (N/8, 0)``);

over three paths, each with its own job:

- ``reference``: the math (``course_lib.attention(impl="reference")``, float64,
  S materialised): the ground truth every error is measured against, and the
  path that runs out of memory first;
- ``public``: what the ecosystem gives (PyTorch's SDPA on the CPU; a window goes
  to it as a boolean mask tensor);
- ``native``: the fastest kernel of the course on this machine (``flash_numba_cpu``);
  where a GPU ran the bench (chapter 10's H200 records), ``gpu_report`` shows the
  same buckets from those records (``cuda_tuned`` against SDPA on the GPU).

Every path is timed in alternated rounds (one call of each path per round, after
a warm-up call that also gives the output), so a load that comes and goes hits
all three alike; a record keeps every round's time and their min, median and max.
It also keeps the error against the reference (max |out - ref|), whether the path
refused the bucket (and why: the largest length each path ran is its maximum
supported length here) and, for the public path, which SDPA backend ran (a
backend that refuses the bucket and lets SDPA fall back is recorded).  A path
that skips masked work runs a masked bucket faster than the unmasked one; the
report's "skips" column compares that gain with the work ratio, which catches a
path that silently computes every tile (SDPA given a mask tensor does).

``compare`` holds a run against a committed one, bucket by bucket.  On a shared
machine the load only ever adds time, so the fastest round is the best estimate
of the code's own time, and how far the median round sits above it (``noise``,
median / min - 1) is how much the load disturbed that run.  A load that stays for
a whole run (another user's job on a 2-core machine) slows every round alike and
leaves no noise, so a run also measures its ``drift``: the median, over every
timed record, of new / old fastest rounds.  The reference and public paths, two
thirds of the records, are code a kernel change does not touch, so the drift is
the machine's speed today against the record's.  A bucket's fastest time is a
regression when, over the drift, it grew by more than the noise of the two runs
allows (``threshold``: 1 + max(``FLOOR``, ``NOISE_K`` x the larger noise)); an
error that grew past twice the old one plus the dtype's rounding, a bucket that
ran and now refuses, and a new fallback are flagged too.  Times are compared only
between runs of one machine (``identity_differs``: the CPU's vendor, family,
model, stepping, feature flags and cores, not only its name), and only where
neither run met a load above ``LOAD_LIMIT`` runnable threads per core (on an
oversubscribed machine the load changes from bucket to bucket faster than a
run's few rounds can see); the comparison says the load each run met.  The
records alone decide: nothing is re-run to compare.  Where both versions of the code are at hand, ``run_pair`` measures
them in the same interleaved rounds, so that whatever load comes meets both, and
their times are compared under any load.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.flops import attention_flops
from ..core.masks import MaskSpec
from .peers import torch_or_none
from .records import environment, latest_run, load_records, new_run, write_records
from .timing import spread

BENCHMARK = "matrix"
PATHS = ("reference", "public", "native")
LENGTHS = {"chat": 1024, "summarise": 32768}
QUICK_LENGTHS = {"chat": 128, "summarise": 1024}
DTYPES = ("float32", "float16", "bfloat16")
MASKS = ("none", "causal", "window")
FLOOR = 0.10         # a time within 10% of the old one is never a regression, however quiet the runs
NOISE_K = 2.0        # a time may move by this many times the noisier run's noise before it counts
LOAD_LIMIT = 1.5     # runnable threads per core (1-minute load average) above which other work held the cores
REFERENCE_BYTES = 2 * 2 ** 30   # the float64 reference materialises S (and P): refused above this


@dataclass(frozen=True)
class Bucket:
    """One problem of the matrix: a workload's shape, kind, precision and mask."""

    workload: str
    kind: str        # "prefill" or "decode"
    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    dtype: str
    mask: str        # "none", "causal" or "window"

    @property
    def window_size(self):
        if self.mask == "window":
            return (max(1, self.Nk // 8), 0)
        return (-1, -1)

    @property
    def causal(self):
        return self.mask == "causal"

    @property
    def mask_label(self):
        return f"window ({self.window_size[0]}, 0)" if self.mask == "window" else self.mask

    def key(self):
        return (self.workload, self.kind, self.B, self.H, self.Nq, self.Nk, self.D, self.dtype, self.mask)

    def flops(self):
        return attention_flops(self.B, self.H, self.Nq, self.Nk, self.D, causal=self.causal,
                               window_size=self.window_size)


def buckets(quick=False, *, lengths=None, heads=None, head_dim=64, dtypes=DTYPES, masks=MASKS,
            kinds=("prefill", "decode")) -> list:
    """Every bucket of the matrix: chat and summarise, prefill and decode, each precision and mask.

    Prefill batches 4 chats (1 summary); decode batches 8 sequences of either length.
    ``lengths`` ({workload: N}) overrides the workloads' lengths (tests use tiny ones)."""
    lengths = lengths or (QUICK_LENGTHS if quick else LENGTHS)
    heads = heads or (4 if quick else 16)
    out = []
    for workload, n in lengths.items():
        for kind in kinds:
            B, Nq = (4 if workload == "chat" else 1, n) if kind == "prefill" else (8, 1)
            for dtype in dtypes:
                for mask in masks:
                    out.append(Bucket(workload, kind, B, heads, Nq, n, head_dim, dtype, mask))
    return out


class Refused(Exception):
    """The path does not take this bucket; the record says why (its maximum supported length here)."""


# -- the three paths ------------------------------------------------------------------------

def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def inputs(bucket, seed=0):
    """Seeded q, k, v of the bucket, in its dtype (numpy)."""
    rng = np.random.default_rng(seed)
    dt = _numpy_dtype(bucket.dtype)
    shapes = [(bucket.B, bucket.H, bucket.Nq, bucket.D)] + [(bucket.B, bucket.H, bucket.Nk, bucket.D)] * 2
    return tuple(rng.standard_normal(s).astype(dt) for s in shapes)


def course_path(impl):
    """A path through ``course_lib.attention`` with ``impl``: (fn() -> out as float64, what ran)."""
    def make(bucket, q, k, v):
        from .. import api
        if impl == "reference":
            need = 2 * bucket.B * bucket.H * bucket.Nq * bucket.Nk * 8
            if need > REFERENCE_BYTES:
                raise Refused(f"S and P in float64 ({need / 2 ** 30:.1f} GiB) exceed {REFERENCE_BYTES / 2 ** 30:.0f} GiB")
        return (lambda: api.attention(q, k, v, impl=impl, causal=bucket.causal, window_size=bucket.window_size)), impl
    return make


def sdpa_path(bucket, q, k, v):
    """PyTorch's SDPA on the CPU: its flash kernel where it takes the bucket, else what SDPA falls back to."""
    torch = torch_or_none()
    if torch is None:
        raise Refused("torch is not installed")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = getattr(torch, bucket.dtype)
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(dt) for x in (q, k, v))
    kwargs = {}
    if bucket.mask == "causal" and bucket.Nq == bucket.Nk:
        kwargs["is_causal"] = True           # torch's is_causal is top-left: the same when Nq == Nk
    elif bucket.mask != "none":              # bottom-right causal for decode, or a window: a mask tensor
        spec = MaskSpec(bucket.Nq, bucket.Nk, causal=bucket.causal, window_size=bucket.window_size)
        kwargs["attn_mask"] = torch.from_numpy(spec.visible(np.arange(bucket.Nq), np.arange(bucket.Nk)))
    ran = "torch_sdpa_flash" + (" (mask tensor)" if "attn_mask" in kwargs else "")

    def call(backend):
        with sdpa_kernel(backend), torch.no_grad():
            return F.scaled_dot_product_attention(tq, tk, tv, **kwargs)
    backend = SDPBackend.FLASH_ATTENTION
    try:
        call(backend)
    except RuntimeError as error:            # the flash kernel refuses: SDPA's default falls back
        ran = f"torch_sdpa_math (fallback: flash refused: {str(error).splitlines()[0][:80]})"
        backend = SDPBackend.MATH
    return (lambda: call(backend)), ran


NATIVE = "flash_numba_cpu"
DEFAULT_PATHS = {"reference": course_path("reference"), "public": sdpa_path, "native": course_path(NATIVE)}


# -- running --------------------------------------------------------------------------------

def _as64(out):
    if hasattr(out, "detach"):
        out = out.detach().float().numpy()
    return np.asarray(out).astype(np.float64)


def reverse(order):
    return order[::-1]


def pairwise(order):
    """(a, b, c, d) -> (b, a, d, c): two versions of a path stay side by side and take turns going first."""
    return [order[i ^ 1] if (i ^ 1) < len(order) else order[i] for i in range(len(order))]


def measure(bucket, paths=None, rounds=3, seed=0, clock=time.perf_counter, truth="reference", swapped=reverse):
    """{path: result} for one bucket: every round's seconds, the error against the reference (the path
    named ``truth``), what ran.  ``swapped(order)`` is the order of every other round."""
    paths = paths or DEFAULT_PATHS
    q, k, v = inputs(bucket, seed)
    calls, results, outs = {}, {}, {}
    for name, make in paths.items():
        try:
            fn, ran = make(bucket, q, k, v)
            outs[name] = _as64(fn())          # the warm-up call: compilation and first touch stay out
            calls[name] = fn
            results[name] = {"ran": ran, "times_s": []}
        except Refused as why:
            results[name] = {"refused": str(why)}
        except (MemoryError, RuntimeError, ValueError, TypeError) as error:
            results[name] = {"refused": f"{type(error).__name__}: {str(error)[:200]}"}
    order = list(calls.items())
    for i in range(rounds):                   # alternated: one call of each path per round, each path first
        for name, fn in (order if i % 2 == 0 else swapped(order)):   # as often as second
            start = clock()
            fn()
            results[name]["times_s"].append(clock() - start)
    ref = outs.get(truth)
    if ref is None:                           # the reference refused: the float64 truth from flash_numpy's tiles
        from .. import api
        ref = api.attention(*(x.astype(np.float64) for x in (q, k, v)), impl="flash_numpy", causal=bucket.causal,
                            window_size=bucket.window_size)
    for name, out in outs.items():
        results[name]["max_abs_err"] = float(np.max(np.abs(out - ref), initial=0.0))
    return results


def to_record(bucket, path, result, run_id, env):
    """One JSON-ready record of one (bucket, path)."""
    rec = {"benchmark": BENCHMARK, "run": run_id, "run_id": run_id, "path": path, "device": env.get("cpu"),
           "layer": "end to end", "workload": bucket.workload, "bucket": bucket.kind, "B": bucket.B, "H": bucket.H,
           "Nq": bucket.Nq, "Nk": bucket.Nk, "D": bucket.D, "dtype": bucket.dtype, "mask": bucket.mask,
           "mask_label": bucket.mask_label, "window_size": list(bucket.window_size), "flops": bucket.flops(),
           "environment": env}
    if "refused" in result:
        return {**rec, "impl": None, "refused": result["refused"], "median_ms": None}
    summary = spread([t * 1e3 for t in result["times_s"]], "ms", every=True)
    fastest, med = summary["min_ms"], summary["median_ms"]
    return {**rec, "impl": result["ran"].split(" ")[0], "ran": result["ran"],
            "fallback": "fallback" in result["ran"], **summary,
            "spread": summary["max_ms"] / fastest - 1, "noise": med / fastest - 1,
            "tflops": bucket.flops() / (med / 1e3) / 1e12, "max_abs_err": result["max_abs_err"]}


def _environment():
    env = environment()
    torch = torch_or_none()
    if torch is not None:
        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    env["load_average"] = list(os.getloadavg())      # 1, 5 and 15 minutes, before and after the run
    return env


def run(todo, out=None, paths=None, rounds=3, progress=True) -> list:
    """Measure every bucket of ``todo`` over ``paths``; records appended to ``out`` (JSON lines) and returned."""
    from tqdm.auto import tqdm
    env, run_id = _environment(), new_run()
    records = []
    for bucket in tqdm(todo, desc="matrix", disable=not progress):
        for path, result in measure(bucket, paths, rounds).items():
            records.append(to_record(bucket, path, result, run_id, env))
    env["load_average_end"] = list(os.getloadavg())  # every record holds this one env
    if out is not None:
        write_records(out, records)
    return records


def run_pair(todo, before=None, after=None, rounds=5, progress=True) -> tuple:
    """(before's records, after's records): two versions of the paths (``before``, ``after``: {path: make})
    measured in the same interleaved rounds, bucket by bucket, each path's two versions side by side
    and taking turns going first, so that a load that comes and goes meets both alike.  The two record
    lists are two runs (ids ``<stamp> before`` and ``<stamp> after``) that ``compare`` holds against
    each other."""
    from tqdm.auto import tqdm
    before, after = before or DEFAULT_PATHS, after or DEFAULT_PATHS
    env, stamp = _environment(), new_run()
    env["interleaved_with"] = stamp          # the two runs met one load: compare reads them as a pair
    both = {(side, p): paths[p] for p in before for side, paths in (("before", before), ("after", after))}
    out = {"before": [], "after": []}
    for bucket in tqdm(todo, desc="matrix pair", disable=not progress):
        for (side, path), result in measure(bucket, both, rounds, truth=("before", "reference"),
                                              swapped=pairwise).items():
            out[side].append(to_record(bucket, path, result, f"{stamp} {side}", env))
    env["load_average_end"] = list(os.getloadavg())
    return out["before"], out["after"]


# -- comparing with the records -----------------------------------------------------------

KEY = ("workload", "bucket", "B", "H", "Nq", "Nk", "D", "dtype", "mask", "path")
IDENTITY = ("vendor", "family", "model", "stepping", "flags_sha", "logical", "usable")


def key_of(r):
    return tuple(r[k] for k in KEY)


def threshold(old, new):
    """The largest ratio of fastest rounds (new / old, over the drift) that the two runs' own noise explains."""
    return 1 + max(FLOOR, NOISE_K * max(old["noise"], new["noise"]))


def rounding(dtype):
    """The error rounding to ``dtype`` costs near 1: what an error may grow by without a regression."""
    return float(np.finfo(_numpy_dtype(dtype)).eps) if dtype != "bfloat16" else 2.0 ** -8


def identity_differs(old_env, new_env) -> str:
    """"" when two runs ran on one kind of machine (CPU vendor, family, model, stepping, feature flags and
    cores all equal), else what differs: a name like "AMD EPYC" alone says too little."""
    a, b = old_env.get("cpu_identity"), new_env.get("cpu_identity")
    if not a or not b:
        return "the CPU's identity (family, model, stepping, flags, cores) is not recorded"
    return ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in IDENTITY if a.get(k) != b.get(k))


def load_per_core(env):
    """The 1-minute load average per usable core the run met: the larger of its start's and its end's."""
    loads = [env[k][0] for k in ("load_average", "load_average_end") if env.get(k)]
    cores = (env.get("cpu_identity") or env.get("cpu_cores") or {}).get("usable") or 1
    return max(loads) / cores if loads else None


@dataclass
class Comparison:
    """What ``compare`` found: the run held against (``baseline``), the flagged buckets, the machine's
    ``drift`` (median new / old fastest round over the ``timed`` records), why times were not compared
    (``untimed``, "" when they were) and the load per core each run met."""

    baseline: str = None
    flagged: list = field(default_factory=list)
    drift: float = 1.0
    timed: int = 0
    untimed: str = ""
    loads: tuple = (None, None)


def _runs(records):
    """The runs among ``records``, oldest first, each a list of its records."""
    runs = {}
    for r in records:
        runs.setdefault(r["run"], []).append(r)
    return list(runs.values())


def _flags(o, r):
    """The regressions of record ``r`` against ``o`` that do not depend on the machine's speed."""
    out = []
    if o.get("median_ms") and not r.get("median_ms"):
        return [dict(key=key_of(r), what="refused, ran before", old=o["median_ms"], new=None, limit=None, record=r,
                     why=r.get("refused"))]
    if not (o.get("median_ms") and r.get("median_ms")):
        return []
    err_limit = 2 * o["max_abs_err"] + rounding(r["dtype"])
    if r["max_abs_err"] > err_limit:
        out.append(dict(key=key_of(r), what="error", old=o["max_abs_err"], new=r["max_abs_err"], limit=err_limit,
                        record=r, why=f"max error {r['max_abs_err']:.3g} > {err_limit:.3g}"))
    if r.get("fallback") and not o.get("fallback"):
        out.append(dict(key=key_of(r), what="fallback", old=o.get("ran"), new=r.get("ran"), limit=None, record=r,
                        why=r.get("ran")))
    return out


def compare(old_records, new_records) -> Comparison:
    """``new_records``' latest run against the latest run of ``old_records`` on the same CPU: its errors,
    refusals and fallbacks, and, where the two runs' machines are one (``identity_differs``), its times
    over the drift.  Only buckets present in both are compared."""
    new = latest_run([r for r in new_records if r.get("benchmark") == BENCHMARK])
    if not new:
        return Comparison(untimed="no matrix run to compare")
    env = new[0]["environment"]
    runs = [run_ for run_ in _runs([r for r in old_records if r.get("benchmark") == BENCHMARK])
            if run_[0]["run"] != new[0]["run"] and run_[0].get("device") == new[0]["device"]]
    if not runs:
        return Comparison(untimed=f"no run of this CPU ({new[0]['device']}) to compare with")
    same = [run_ for run_ in runs if not identity_differs(run_[0]["environment"], env)]
    old = (same or runs)[-1]
    result = Comparison(baseline=old[0]["run_id"], untimed="" if same else
                        f"not the same machine as run {old[0]['run_id']}: " + identity_differs(old[0]["environment"], env),
                        loads=(load_per_core(old[0]["environment"]), load_per_core(env)))
    paired = env.get("interleaved_with") and env.get("interleaved_with") == old[0]["environment"].get("interleaved_with")
    busy = [x for x in result.loads if x is not None and x > LOAD_LIMIT]
    if busy and not paired and not result.untimed:
        result.untimed = (f"a load of {max(busy):.1f} runnable threads per core (above {LOAD_LIMIT}): other work held "
                          f"the cores, and one run's times cannot tell its load from the code's (run_pair can)")
    before = {key_of(r): r for r in old}
    pairs = [(before[key_of(r)], r) for r in new if key_of(r) in before]
    for o, r in pairs:
        result.flagged += _flags(o, r)
    timed = [(o, r) for o, r in pairs if o.get("median_ms") and r.get("median_ms")]
    if result.untimed or not timed:
        return result
    result.timed = len(timed)
    ratios = [r["min_ms"] / o["min_ms"] for o, r in timed]
    result.drift = float(np.median(ratios)) if len(ratios) >= 3 else 1.0
    for (o, r), ratio in zip(timed, ratios):
        limit = threshold(o, r)
        if ratio / result.drift > limit:
            result.flagged.append(dict(
                key=key_of(r), what="time", old=o["min_ms"], new=r["min_ms"], limit=limit, record=r,
                why=f"fastest round {o['min_ms']:.3g} -> {r['min_ms']:.3g} ms, {ratio:.2f}x; over the drift "
                    f"{ratio / result.drift:.2f}x, the noise allows {limit:.2f}x"))
    return result


# -- the report ----------------------------------------------------------------------------

def _name(r):
    return f"{r['workload']:9s} {r['bucket']:7s} {r['B']:2d} {r['H']:2d} {r['Nq']:6d} {r['Nk']:6d} {r['dtype']:8s} " \
           f"{r['mask_label']:16s}"


def skips(records):
    """{(bucket key without mask, path, mask): (time gain over the unmasked bucket, work ratio)} of one run."""
    by = {key_of(r): r for r in records if r.get("median_ms")}
    out = {}
    for k, r in by.items():
        if r["mask"] == "none":
            continue
        base = by.get(k[:8] + ("none",) + k[9:])
        if base:
            out[k] = (base["min_ms"] / r["min_ms"], base["flops"] / r["flops"])
    return out


def _ran(r):
    """What ran, short: the public path's SDPA kernel (``+mask``: given a mask tensor; ``math, fallback``),
    and nothing where the path ran what it always runs."""
    if r["path"] != "public":
        return "" if r["ran"] in (NATIVE, "reference") else r["ran"][:20]
    kernel = r["ran"].removeprefix("torch_sdpa_").split(" ")[0]
    return kernel + (", fallback" if r.get("fallback") else "") + (" +mask" if "mask tensor" in r["ran"] else "")


def report(records) -> str:
    """The table of one run: per bucket and path, min / median / max ms, error, what ran, and whether a
    mask's skipped work shows in its time (``skips``, where the mask removes at least a third of the work:
    the fastest round's gain over the unmasked bucket at least half the work ratio).  Every line fits
    110 characters."""
    run_ = latest_run([r for r in records if r.get("benchmark") == BENCHMARK])
    if not run_:
        return "no matrix records"
    env = run_[0]["environment"]
    gain = skips(run_)
    cores = env.get("cpu_cores")
    cores = cores.get("usable") if isinstance(cores, dict) else cores
    heads = sorted({(r["H"], r["D"]) for r in run_})
    lines = [f"run {run_[0]['run_id']} on {run_[0]['device']} ({cores} cores; end-to-end ms, "
             f"min / median / max of {run_[0].get('rounds', '?')} alternated rounds)",
             "prefill: Nq = Nk = N, B 4 (chat) or 1 (summarise); decode: Nq = 1, Nk = N, B 8; "
             + ", ".join(f"H {h}, D {d}" for h, d in heads),
             f"{'workload':9s} {'kind':7s} {'N':>5s} {'dtype':8s} {'mask':10s} {'path':9s} {'min':>7s} "
             f"{'median':>7s} {'max':>7s} {'max err':>7s} {'skips':>5s}  ran"]
    for r in sorted(run_, key=lambda r: (key_of(r)[:8], MASKS.index(r["mask"]), PATHS.index(r["path"]))):
        mask = f"window {r['window_size'][0]}" if r["mask"] == "window" else r["mask"]
        name = f"{r['workload']:9s} {r['bucket']:7s} {r['Nk']:5d} {r['dtype']:8s} {mask:10s} {r['path']:9s}"
        if not r.get("median_ms"):
            lines.append(f"{name} refused: {r.get('refused', '')[:59]}")
            continue
        g = gain.get(key_of(r))
        mark = "" if g is None or g[1] < 1.5 else ("yes" if g[0] >= 0.5 * g[1] else "NO")
        lines.append(f"{name} {r['min_ms']:7.2f} {r['median_ms']:7.2f} {r['max_ms']:7.2f} "
                     f"{r['max_abs_err']:7.1e} {mark:>5s}  {_ran(r)}".rstrip())
    lines.append("ran: the public path's SDPA kernel (+mask: given a mask tensor; fallback: what SDPA fell back to)")
    lines.append("max supported length here (largest Nk each path ran): " + "; ".join(
        f"{p} {max((r['Nk'] for r in run_ if r['path'] == p and r.get('median_ms')), default=0)}" for p in PATHS))
    return "\n".join(lines)


GPU_PATHS = {"native": ("cuda_tuned",), "public": ("torch_sdpa_efficient", "torch_sdpa_flash")}


def gpu_report(bench_records, lengths=None, head_dim=64) -> str:
    """The matrix's buckets where a GPU's ``python -m course_lib.bench`` records exist (chapter 10's H200
    run): the native path is chapter 10's ``cuda_tuned``, the public one SDPA's efficient kernel (fp32)
    or its flash kernel (fp16), the kernel layer; no float64 reference was timed there, and that run
    has no window or bfloat16 buckets."""
    lengths = tuple(LENGTHS.values()) if lengths is None else lengths
    rows = [r for r in bench_records if r.get("benchmark") == "bench" and r.get("layer") == "kernel"]
    run_ = latest_run(rows)
    if not run_:
        return "no GPU bench records"
    lines = [f"GPU records: run {run_[0]['run_id']} on {run_[0]['device']} (kernel time, median of "
             f"{run_[0].get('repeats', '?')})"]
    for r in sorted(run_, key=lambda r: (r["bucket"], r["Nk"], r["dtype"], r["causal"])):
        if r["Nk"] not in lengths or r["D"] != head_dim:
            continue
        path = next((p for p, impls in GPU_PATHS.items() if r["impl"] in impls), None)
        if path is None or (path == "public" and not r.get("median_ms")):   # the other SDPA kernel took it
            continue
        mask = "causal" if r["causal"] else "none"
        what = f"{r['median_ms']:9.3f} ms" if r.get("median_ms") else f"  {(r.get('skipped') or '').split(':')[0][:30]}"
        lines.append(f"{r['bucket']:7s} {r['B']:2d} {r['H']:2d} {r['Nq']:6d} {r['Nk']:6d} {r['dtype']:8s} {mask:7s} "
                     f"{path:7s} {r['impl']:21s} {what}")
    return "\n".join(lines)


def format_regressions(comparison: Comparison) -> str:
    """The comparison in lines of at most 110 characters: the baseline and the loads, the drift, then
    two lines per flagged bucket (REGRESSION, the bucket and path; why)."""
    c = comparison
    if c.baseline is None:
        return c.untimed
    load = " / ".join("?" if x is None else f"{x:.1f}" for x in c.loads)
    lines = [f"against run {c.baseline} (load per core then / now: {load})"]
    if c.untimed:
        lines.append(f"times not compared: {c.untimed}")
    else:
        lines.append(f"machine drift: {c.drift:.2f}x (median new / old fastest round of {c.timed} records)")
        if c.drift > 1 + FLOOR:
            lines.append("  every path is slower alike: the machine is busier now, or every path regressed")
    lines.append(f"{len(c.flagged)} regression(s)" if c.flagged else "no regressions")
    for f in c.flagged:
        r = f["record"]
        lines.append(f"REGRESSION {r['workload']} {r['bucket']} B {r['B']} H {r['H']} Nq {r['Nq']} Nk {r['Nk']} "
                     f"{r['dtype']} {r['mask_label']} {r['path']}")
        lines.append(f"    {f['what']}: {str(f['why'])[:96]}")
    return "\n".join(lines)


def main(args) -> int:
    """``--matrix``: run the buckets, write the records, print the report and the regressions against
    ``--compare``'s latest run of this machine (exit status 1 when any bucket regressed)."""
    t0 = time.perf_counter()
    records = run(buckets(args.quick), out=args.out, rounds=args.rounds, progress=not args.quiet)
    print(report(records))
    print(f"{len(records)} records appended to {args.out} in {time.perf_counter() - t0:.0f} s")
    gpu = Path(__file__).resolve().parents[2] / "notebooks" / "records" / "bench.jsonl"
    if gpu.exists():
        print(gpu_report(load_records(gpu), lengths=tuple(LENGTHS.values())))
    if args.compare:
        comparison = compare(load_records(args.compare, benchmark=BENCHMARK), records)
        print(format_regressions(comparison))
        return 1 if comparison.flagged else 0
    return 0
