"""``python -m course_lib.bench``: shape buckets over every impl that runs here, one record each.

    python -m course_lib.bench                      # the buckets that fit this machine
    python -m course_lib.bench --sizes 1024 4096 --head-dims 64 --no-decode
    python -m course_lib.bench --report notebooks/records/bench.jsonl
    python -m course_lib.bench --matrix --quick --compare notebooks/records/matrix_cpu.jsonl

``--matrix`` runs the regression matrix instead (``matrix.py``: workloads x
prefill / decode x precision x mask over the reference, public and native paths,
compared with committed records, regressions flagged against the measured noise).

Buckets: prefill (Nq = Nk = N for N in ``--sizes``: 1K / 4K / 16K / 32K on a
GPU, smaller on a CPU) and decode (Nq = 1, Nk = 32K, batch 8), D 64 / 128,
causal or not, float32 and float16; H = 16 and B = tokens / N.  Impls:

- on any machine, the course's CPU impls (``naive``, ``flash_numpy``,
  ``flash_numba_cpu``) through ``course_lib.attention``, numpy in and out:
  layer ``end to end``;
- where torch is installed, its peers on the CPU (``torch_naive``,
  ``torch_sdpa_math`` ...), layer ``end to end`` (no copies: inputs live there);
- on a CUDA GPU, ``cuda_tuned`` (chapter 10's SIMT kernel, fp32), chapter 11's
  tensor-core steps ``cuda_mma_f16`` (fp16 in, fp32 accumulation) and
  ``cuda_mma_3xtf32`` (fp32 as three tf32 products), and the peers
  ``torch_naive``, ``torch_sdpa_efficient``, ``torch_sdpa_math``,
  ``torch_sdpa_flash``, ``torch_sdpa_cudnn`` (the last two fp16), inputs on
  the device, timed between CUDA events: layer ``kernel``.

Every record says what its impl ran on (``runs_on``: ``RUNS_ON`` for the
course's impls, ``peers.PEER_RUNS_ON`` for torch's on a GPU): a ratio of two
times means something only beside the units each one used.  A bucket an impl
cannot take (chapter 10's kernel in fp16, ``mma_f16`` in fp32, SDPA flash in
fp32, a problem too large for the memory) is recorded with its reason and no
time.  Records go to ``--out`` (JSON lines), one per measurement, all with one
``run_id``; ``--report`` prints the table of a file's latest run, with each
time as a ratio to ``torch_naive`` (or ``naive``) of the same run and bucket.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from ..core.hardware import hardware, preset_for
from .peers import PEER_DTYPES, TORCH_PEERS, gpu_here, peer_runs_on, torch_calls, torch_or_none
from .records import RecordFile, environment, latest_run, load_records, new_run, record
from .timing import cuda_time_it, time_it

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "notebooks" / "records" / "bench.jsonl"
MATRIX_OUT = ROOT / "notebooks" / "records" / "matrix_cpu.jsonl"
GPU_SIZES = (1024, 4096, 16384, 32768)
CPU_SIZES = (256, 1024)
CPU_IMPLS = ("naive", "flash_numpy", "flash_numba_cpu")
CPU_PEERS = ("torch_naive", "torch_sdpa_math", "torch_sdpa_flash")
MMA_STEPS = {"cuda_mma_f16": "mma_f16", "cuda_mma_3xtf32": "mma_3xtf32"}   # impl: its tensor_cores step
GPU_IMPLS = ("cuda_tuned", *MMA_STEPS)
RUNS_ON = {**dict.fromkeys(CPU_IMPLS, "CPU"), "cuda_tuned": "SIMT fp32",
           "cuda_mma_f16": "mma.sync m16n8k16, fp32 accumulation",
           "cuda_mma_3xtf32": "mma.sync m16n8k8 tf32, 3 products"}


def buckets(sizes, head_dims, *, causal=(False, True), dtypes=("float32", "float16"), decode=True,
            tokens=16384, heads=16, decode_nk=32768, decode_batch=8):
    """Every (kind, B, H, Nq, Nk, D, causal, dtype) bucket, prefill first."""
    out = []
    for n in sizes:
        for d in head_dims:
            for c in causal:
                for dt in dtypes:
                    out.append(dict(kind="prefill", B=max(1, tokens // n), H=heads, Nq=n, Nk=n, D=d, causal=c,
                                    dtype=dt))
    if decode:
        for d in head_dims:
            for dt in dtypes:
                out.append(dict(kind="decode", B=decode_batch, H=heads, Nq=1, Nk=decode_nk, D=d, causal=False,
                                dtype=dt))
    return out


def impls_here(on_gpu, torch_here) -> list:
    """The impls a run times on this machine: on a GPU the course's CUDA kernels and torch's peers, inputs on
    the device; elsewhere the course's CPU impls registered here and, where torch is installed, its CPU peers."""
    if on_gpu:
        return [*GPU_IMPLS, *TORCH_PEERS]
    from .. import api
    impls = [i for i in CPU_IMPLS if i in api.available_impls()]
    return impls + list(CPU_PEERS) if torch_here else impls


def runs_on(impl, dtype, on_gpu) -> str:
    """What did an impl's products: the course's impls say it in ``RUNS_ON``; a torch peer runs on the CPU,
    or on a GPU on what ``PEER_RUNS_ON`` says for the dtype."""
    if impl in RUNS_ON:
        return RUNS_ON[impl]
    return peer_runs_on(impl, dtype) if on_gpu else "CPU"


class Timer:
    """Median seconds of fn(): CUDA events on a GPU (layer kernel), perf_counter on the CPU."""

    def __init__(self, repeats, warmup, on_gpu):
        self.repeats, self.warmup, self.on_gpu = repeats, warmup, on_gpu

    def __call__(self, fn):
        if not self.on_gpu:
            return time_it(fn, repeats=self.repeats, warmup=self.warmup)
        return cuda_time_it(fn, self.repeats, self.warmup)[0]


def run(args) -> list:
    """Run every bucket over every impl that runs here; returns the records (also appended to args.out)."""
    from tqdm.auto import tqdm

    on_gpu = gpu_here() and not args.cpu
    torch = torch_or_none()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    env = environment()
    if torch is not None:
        env["torch"] = torch.__version__
        if on_gpu:
            env.update(gpu=torch.cuda.get_device_name(0), torch_cuda=torch.version.cuda)
    run_id = new_run()
    sizes = args.sizes or (GPU_SIZES if on_gpu else CPU_SIZES)
    todo = buckets(sizes, args.head_dims, dtypes=args.dtypes, decode=args.decode,
                   tokens=args.tokens if on_gpu else args.cpu_tokens, heads=args.heads,
                   decode_nk=args.decode_nk if on_gpu else min(args.decode_nk, 4096))
    timer = Timer(args.repeats, args.warmup, on_gpu)
    device = env.get("gpu") if on_gpu else env.get("cpu")
    layer = "kernel" if on_gpu else "end to end"
    impls = impls_here(on_gpu, torch is not None)
    if args.impls:
        impls = [i for i in impls if i in args.impls]
    records = []
    rng = np.random.default_rng(0)
    with RecordFile(args.out) as out, tqdm(total=len(todo) * len(impls), desc="bench",
                                           disable=args.quiet) as bar:
        for b in todo:
            shape = (b["B"], b["H"], b["Nq"], b["Nk"], b["D"])
            arrays = None
            for impl in impls:
                bar.set_postfix_str(f"{impl} {b['kind']} N={b['Nk']} D={b['D']} {b['dtype']}")
                rec = None
                try:
                    if arrays is None:
                        arrays = make_inputs(b, rng, on_gpu)
                    fn = callable_for(impl, b, arrays, on_gpu)
                    t = timer(fn)
                    rec = record(benchmark="bench", impl=impl, shape=shape, dtype=b["dtype"], time_s=t,
                                       causal=b["causal"], run=run_id, env=env, layer=layer, device=device,
                                       bucket=b["kind"], repeats=args.repeats, warmup=args.warmup)
                except NotApplicable as why:
                    rec = skipped(impl, b, run_id, env, device, layer, f"not applicable: {why}")
                except Exception as error:  # noqa: BLE001 -- a failure is a record, and the run goes on
                    rec = skipped(impl, b, run_id, env, device, layer, f"{type(error).__name__}: {str(error)[:300]}")
                    if args.verbose:
                        traceback.print_exc()
                    if torch is not None and on_gpu:
                        torch.cuda.empty_cache()
                rec["runs_on"] = runs_on(impl, b["dtype"], on_gpu)
                out.write(rec)
                records.append(rec)
                bar.update()
            del arrays
            if torch is not None and on_gpu:
                torch.cuda.empty_cache()
    return records


class NotApplicable(Exception):
    """This impl does not take this bucket (dtype, size); the record says so."""


def skipped(impl, b, run_id, env, device, layer, reason):
    return {"benchmark": "bench", "run": run_id, "run_id": run_id, "impl": impl, "device": device, "layer": layer,
            "bucket": b["kind"], "B": b["B"], "H": b["H"], "Nq": b["Nq"], "Nk": b["Nk"], "D": b["D"],
            "causal": b["causal"], "dtype": b["dtype"], "median_ms": None, "tflops": None, "skipped": reason,
            "environment": env}


def make_inputs(b, rng, on_gpu):
    shape_q = (b["B"], b["H"], b["Nq"], b["D"])
    shape_k = (b["B"], b["H"], b["Nk"], b["D"])
    if on_gpu:
        import torch
        g = torch.Generator(device="cuda").manual_seed(0)
        dt = torch.float16 if b["dtype"] == "float16" else torch.float32
        return tuple(torch.randn(s, device="cuda", generator=g, dtype=dt) for s in (shape_q, shape_k, shape_k))
    dt = np.float16 if b["dtype"] == "float16" else np.float32
    return tuple(rng.standard_normal(s).astype(dt) for s in (shape_q, shape_k, shape_k))


def callable_for(impl, b, arrays, on_gpu):
    q, k, v = arrays
    causal = b["causal"]
    if impl.startswith("torch_"):
        torch = torch_or_none()
        if torch is None:
            raise NotApplicable("torch is not installed")
        if impl in PEER_DTYPES and b["dtype"] not in PEER_DTYPES[impl]:
            raise NotApplicable(f"{impl} takes {' / '.join(PEER_DTYPES[impl])} only")
        if impl in ("torch_naive", "torch_sdpa_math"):
            need = b["B"] * b["H"] * b["Nq"] * b["Nk"] * np.dtype(b["dtype"]).itemsize * 3
            free = torch.cuda.mem_get_info()[0] if on_gpu else 16 * 2 ** 30
            if need > free:
                raise NotApplicable(f"S and P ({need / 2 ** 30:.0f} GiB) do not fit in {free / 2 ** 30:.0f} GiB")
        if not on_gpu:
            q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        return torch_calls(q, k, v, causal)[impl]
    if impl == "cuda_tuned":
        if b["dtype"] != "float32":
            raise NotApplicable("chapter 10's kernel computes in float32 only")
        return cuda_call(b, arrays)
    if impl in MMA_STEPS:
        return mma_call(MMA_STEPS[impl], b, arrays)
    from .. import api
    if impl == "naive" and b["Nq"] * b["Nk"] * b["B"] * b["H"] > 2 ** 28:
        raise NotApplicable("S would not fit in memory")
    return lambda: api.attention(q, k, v, impl=impl, causal=causal)


def validated(arrays, causal):
    """(opts, mask) as ``call_forward`` hands them to an impl: a kernel launched by hand gets the public API's
    checks and defaults, and no copy of them."""
    from ..core.options import call_forward
    got = {}

    def grab(q, k, v, opts, mask):
        got.update(opts=opts, mask=mask)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, *arrays, causal=causal)
    return got["opts"], got["mask"]


def cuda_call(b, arrays):
    """cuda_steps' tuned kernel on device tensors (zero-copy), its launch planned once."""
    import torch
    from numba import cuda

    from ..kernels import cuda_steps as cs
    q, k, v = arrays
    B, H, Nq, Nk, D = b["B"], b["H"], b["Nq"], b["Nk"], b["D"]
    host = [np.empty(t.shape, np.float32) for t in (q, k, v)]   # the plan needs shapes only
    tiling = cs.DECODE_TILING if b["kind"] == "decode" else None
    splits = 1
    if b["kind"] == "decode":   # split-KV, as many splits as cs.decode_splits's rule asks for
        splits = cs.decode_splits(B * H, -(-Nk // tiling.Bc), tiling, D, D)[0]
    p = cs.plan("tuned", *host, *validated(host, b["causal"]), tiling=tiling, splits=splits)
    from dataclasses import replace
    p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    out = torch.empty((B, H, Nq, D), device="cuda")
    lse = torch.empty((B, H, Nq), device="cuda")
    parts = (torch.empty((p.splits, B, H, Nq, D), device="cuda"), torch.empty((p.splits, B, H, Nq), device="cuda"))
    dev = [cuda.as_cuda_array(t) for t in (q, k, v, out, lse, *parts)]
    return cs.launcher(p, *dev)


def mma_call(step, b, arrays):
    """A tensor-core step of chapter 11 (``tensor_cores``) on the bucket's inputs, split-KV at decode as
    ``tensor_cores.decode_splits`` chooses.  Its launcher converts and copies the inputs to the device once,
    here: the timed call is the kernel (and split-KV's merge) alone."""
    from ..kernels import tensor_cores as tc
    try:
        tc.kind_of(step, b["dtype"])
    except TypeError as why:
        raise NotApplicable(str(why)) from None
    if not tc.available():
        raise NotApplicable(f"{step} is not available here: inline PTX, it runs on a GPU's tensor cores only")
    host = [x if isinstance(x, np.ndarray) else x.cpu().numpy() for x in arrays]   # torch's device tensors
    B, H, Nq, Nk, D = b["B"], b["H"], b["Nq"], b["Nk"], b["D"]
    splits = 1
    if b["kind"] == "decode":   # split-KV, as many splits as the tensor-core launch's rule asks for
        splits = tc.decode_splits(step, b["dtype"], B, H, Nq, Nk, D, D)[0]
    return tc.launcher(step, *host, *validated(host, b["causal"]), splits=splits)[0]


# -- the report ----------------------------------------------------------------------------------

def report(records, baseline=("torch_naive", "naive"), runs_on=False) -> str:
    """A table of one run: impl, bucket, median ms, TFLOP/s, ratio to the baseline of the same bucket; with
    ``runs_on``, a last column of what each impl ran on (the records' field: SIMT, which tensor-core
    instruction or library), left out by default so that the tables committed without it read as before."""
    rows = [r for r in records if r.get("benchmark") == "bench"]
    if not rows:
        return "no bench records"
    run_id = rows[-1]["run_id"]
    rows = [r for r in rows if r["run_id"] == run_id]
    key = lambda r: (r["bucket"], r["Nq"], r["Nk"], r["D"], r["causal"], r["dtype"])
    base = {}   # the baseline of each shape: the first of ``baseline`` that ran, in float32 where it ran in float32
    for r in sorted(rows, key=lambda r: (r["dtype"] != "float32", baseline.index(r["impl"]) if r["impl"] in baseline
                                         else len(baseline))):
        if r["impl"] in baseline and r.get("median_ms"):
            base.setdefault(key(r)[:5], r)
    first = rows[0]
    lines = [f"run {run_id} on {first.get('device')} ({first.get('layer')} time; "
             f"ratio = {' or '.join(baseline)} (float32) time / this time, same run and shape)",
             f"{'bucket':8s} {'B':>3s} {'H':>3s} {'Nq':>6s} {'Nk':>6s} {'D':>4s} {'causal':>6s} {'dtype':8s} "
             f"{'impl':22s} {'median ms':>10s} {'TFLOP/s':>8s} {'ratio':>6s}" + ("  runs on" if runs_on else "")]
    for r in sorted(rows, key=lambda r: (*key(r), r["impl"])):
        b = base.get(key(r)[:5])
        if r.get("median_ms"):
            ratio = f"{b['median_ms'] / r['median_ms']:6.2f}" if b else "     -"
            tail = f"{r['median_ms']:10.3f} {r['tflops']:8.2f} {ratio}" + (f"  {r.get('runs_on', '-')}" if runs_on else "")
        else:
            tail = f"  {r.get('skipped', '')[:60]}"
        lines.append(f"{r['bucket']:8s} {r['B']:3d} {r['H']:3d} {r['Nq']:6d} {r['Nk']:6d} {r['D']:4d} "
                     f"{str(r['causal']):>6s} {r['dtype']:8s} {r['impl']:22s} {tail}")
    return "\n".join(lines)


def roofline_points(records):
    """(intensity FLOP/byte over compulsory bytes, TFLOP/s, impl, dtype) of one run's timed records."""
    pts = []
    for r in records:
        if r.get("median_ms"):
            pts.append((r["flops"] / r["bytes_moved"], r["tflops"], r["impl"], r["dtype"]))
    return pts


def plot_roofline(records, hw=None, ax=None):
    """The measured points of one run, on the datasheet roofline (fp32 and fp16) of the machine that ran them.

    ``hw`` defaults to the preset named by the records' device; a machine without one (any CPU) is drawn
    without a roof, and the title says so, rather than against the roof of a machine it is not.
    """
    import matplotlib.pyplot as plt

    device = next((r.get("device") for r in records if r.get("device")), None)
    hw = hw or preset_for(device)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    x = np.logspace(-1, 5, 200)
    if hw is None:
        ax.set_title(f"{device}: no datasheet roofline in the course's presets, points only", fontsize=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        machine = hardware(hw)
        for dt, style in (("float32", "-"), ("float16", "--")):
            ax.loglog(x, [machine.attainable(i, dt) / 1e12 for i in x], "k" + style, lw=1,
                      label=f"{machine.name} roofline, {dt} (datasheet)")
    pts = roofline_points(records)
    for impl in sorted({p[2] for p in pts}):
        mine = [p for p in pts if p[2] == impl]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=18, label=impl)
    ax.set_xlabel("FLOP per compulsory byte (Q, K, V read once, O written once)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the axes: it hides no point
    return ax


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course_lib.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"records file (default {DEFAULT_OUT.name}, "
                        f"with --matrix {MATRIX_OUT.name})")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16384, help="B = tokens / N on a GPU")
    parser.add_argument("--cpu-tokens", type=int, default=256, help="B = tokens / N on the CPU")
    parser.add_argument("--decode-nk", type=int, default=32768)
    parser.add_argument("--no-decode", dest="decode", action="store_false")
    parser.add_argument("--impls", nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tuned", default=None, metavar="FILE",
                        help="take cuda_tuned's tile sizes from FILE's gpu_steps_tuned records (benchmarks/gpu_steps.py)")
    parser.add_argument("--cpu", action="store_true", help="the CPU impls even where a GPU is present")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--report", default=None, metavar="FILE", help="print the table of FILE's latest run")
    parser.add_argument("--plot", default=None, metavar="PNG", help="with --report: save the roofline plot")
    parser.add_argument("--matrix", action="store_true", help="run the regression matrix (three paths, buckets)")
    parser.add_argument("--quick", action="store_true", help="with --matrix: lengths 128 / 1024 instead of 1K / 32K")
    parser.add_argument("--compare", default=None, metavar="RECORDS",
                        help="with --matrix: flag regressions against RECORDS' latest run of this machine")
    parser.add_argument("--rounds", type=int, default=3, help="with --matrix: alternated timing rounds")
    args = parser.parse_args(argv)
    if args.matrix:
        from . import matrix
        args.out = args.out or str(MATRIX_OUT)
        return matrix.main(args)
    args.out = args.out or str(DEFAULT_OUT)
    if args.report:
        records = load_records(args.report, benchmark="bench")
        print(report(records, runs_on=True))
        if args.plot:
            import matplotlib
            matplotlib.use("Agg")
            last = latest_run(records)
            plot_roofline(last).figure.savefig(args.plot, dpi=120, bbox_inches="tight")
        return 0
    if args.tuned:
        from ..kernels import cuda_steps as cs
        for r in load_records(args.tuned, benchmark="gpu_steps_tuned"):
            cs.TUNED[r["D"]] = cs.Tiling(**r["tiling"])
    t0 = time.perf_counter()
    records = run(args)
    print(report(records, runs_on=True))
    print(f"{len(records)} records appended to {args.out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
