"""The precision experiment group of chapter 11: error of out and lse against float64.

    .venv/bin/python benchmarks/lowp_error_study.py          # append one run to the records

Change the precision, keep the tile (Bc = 128): every recipe of
``course_lib.lowp.study`` (fp8 as FA3 runs it, P shifted by 2**8; fp8 with P
in [0, 1], as the course's kernels run it; fp16, bf16, and each source alone:
inputs, P rounding, a float16 accumulator) on the same inputs, swept over the
row length (1K to 64K keys), the logit scale (q multiplied by it: a
temperature sweep that sharpens the softmax) and outliers in K (one channel
multiplied), the latter also with per-tensor scales and with incoherent
processing (a random Hadamard on Q and K before quantising).  Each point
holds the max abs error of out and of lse, out's relative RMS error and the
mean KL divergence of the attention rows.  A sharp softmax makes one draw's
error depend on which few keys win, so the scale and outlier points are the
mean over ``--seeds`` draws (``seeds`` lists them, ``out_rel_rms_range`` the
smallest and largest draw); a length point is one draw.  Appends one JSON
line per point to ``notebooks/records/lowp_error.jsonl``; chapter 11 plots
them.  Errors, not times: the numbers do not depend on the machine (seeded
inputs, float64).
"""
import argparse
from pathlib import Path

import numpy as np

from course_lib import bench
from course_lib.lowp import formats, study

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "notebooks" / "records" / "lowp_error.jsonl"
KL_MAX_KEYS = 16384  # the KL divergence materialises the rows (Nq x Nk); longer rows are left out


def point(q, k, v, recipes, *, kl=True):
    """name -> errors (and KL) of each recipe on these inputs."""
    result = study.measure(q, k, v, recipes)
    if kl and k.shape[2] <= KL_MAX_KEYS:
        exact = study.weights(q, k)
        for name, recipe in recipes.items():
            result[name]["kl_mean"] = float(study.row_kl(exact, study.weights(q, k, recipe)).mean())
    return result


def averaged(draws):
    """name -> each field's mean over the draws (one ``point`` each), with the draws' range of out_rel_rms."""
    result = {}
    for name in draws[0]:
        fields = {f: float(np.mean([d[name][f] for d in draws])) for f in draws[0][name]}
        rel = [d[name]["out_rel_rms"] for d in draws]
        result[name] = {**fields, "out_rel_rms_range": [min(rel), max(rel)]}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.5, 1, 2, 4, 8])
    parser.add_argument("--outliers", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--seqlen-q", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=8, help="draws averaged at each scale and outlier point")
    parser.add_argument("--out", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    run, env = bench.new_run(), bench.environment()
    recipes = {**study.RECIPES, **study.SOURCES}
    shape = dict(seqlen_q=args.seqlen_q, head_dim=args.head_dim, heads=args.heads)
    lines = []

    def keep(sweep, x, result, used, seeds, **extra):
        for name, errs in result.items():
            lines.append({"benchmark": "lowp_error", "run": run, "sweep": sweep, "x": x, "recipe": name,
                          "label": used[name].label, "granularity": used[name].granularity, **shape, **extra,
                          "seeds": seeds, **errs, "environment": env})
        print(f"{sweep:>8} {x:>8g} " + "  ".join(f"{n}: {e['out_rel_rms']:.2e}" for n, e in result.items()
                                                  if n in study.RECIPES), flush=True)

    for n in args.lengths:
        q, k, v = study.study_inputs(np.random.default_rng(n), seqlen_k=n, **shape)
        keep("length", n, averaged([point(q, k, v, recipes)]), recipes, [n], seqlen_k=n)
    seeds = list(range(args.seeds))
    for t in args.scales:
        draws = [point(*study.study_inputs(np.random.default_rng([11, s]), seqlen_k=4096, logit_scale=t, **shape),
                       recipes) for s in seeds]
        keep("scale", t, averaged(draws), recipes, seeds, seqlen_k=4096)
    fp8 = {"fp8 FA3": study.RECIPES["fp8 FA3"], "fp8": study.RECIPES["fp8"], "fp16": study.RECIPES["fp16"],
           "fp8 per-tensor": study.Recipe("float8_e4m3fn", "float8_e4m3fn", granularity="tensor")}
    incoherent = {"fp8 incoherent": study.RECIPES["fp8"]}
    for f in args.outliers:
        plain, spread = [], []
        for s in seeds:
            q, k, v = study.study_inputs(np.random.default_rng([12, s]), seqlen_k=4096, outlier=f, **shape)
            plain.append(point(q, k, v, fp8))
            qi, ki = formats.incoherent(q, k, np.random.default_rng([13, s]))
            spread.append(point(qi, ki, v, incoherent))
        keep("outlier", f, averaged(plain), fp8, seeds, seqlen_k=4096)
        keep("outlier", f, averaged(spread), incoherent, seeds, seqlen_k=4096)
    bench.write_records(args.out, lines)
    print(f"{len(lines)} records appended to {args.out} (run {run})")


if __name__ == "__main__":
    main()
