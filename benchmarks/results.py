"""The measured results, written from the records: benchmarks/README.md's results section and the
speed column of the impl registry (the table in course_lib/kernels/__init__.py's docstring).

    python benchmarks/results.py            # rewrite both from notebooks/records/*.jsonl
    python benchmarks/results.py --check    # exit 1 when either differs from a fresh rendering

Every figure here is computed from its records and printed beside its run and card, so a
figure changes only when a record does; tests/test_quoted_figures.py holds the committed
text to a fresh rendering.  A ratio divides two rates of one run (never of two runs), and
a rate of several rounds of one run is their median.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "notebooks" / "records"
README = REPO / "benchmarks" / "README.md"
REGISTRY = REPO / "course_lib" / "kernels" / "__init__.py"
BEGIN, END = "<!-- results: written by benchmarks/results.py, do not edit -->", "<!-- end of results -->"

# The registry's speed column: the shape every row is quoted at, and the benchmarks that time
# the registry's impls at their defaults there (not the sweeps, variants or tuning candidates).
HEADLINE = {"BH": 64, "N": 4096}
TIMED = {"gpu_steps": "gpu_steps", "gpu_steps_chain": "gpu_steps_chain", "gpu_mma": "gpu_mma_time"}
FP32_PEER, HALF_PEER = "torch_sdpa_efficient", "torch_sdpa_flash"
PEER_NAMES = {"torch_naive": "naive torch", FP32_PEER: "SDPA efficient", HALF_PEER: "FlashAttention-2"}


@functools.lru_cache(maxsize=None)
def load(name):
    """Every record of notebooks/records/NAME.jsonl, oldest first (read once; not to be changed)."""
    with (RECORDS / f"{name}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def card(record):
    """The machine a record ran on: its GPU, or its CPU where it ran on none."""
    env = record.get("environment", {})
    gpu = env.get("gpu")
    return gpu if gpu not in (None, "none", "simulator") else env.get("cpu", record.get("device", "?"))


def seconds(record):
    return record["time_s"] if "time_s" in record else record["median_s"]


def rate(records, **match):
    """The median TFLOP/s of the records whose fields equal ``match``, or None."""
    got = [r["tflops"] for r in records if all(r.get(k) == v for k, v in match.items())]
    return statistics.median(got) if got else None


def at_headline(record):
    """A kernel time at B*H = 64, Nq = Nk = 4096, no mask."""
    return ("tflops" in record and record["B"] * record["H"] == HEADLINE["BH"]
            and record["Nq"] == record["Nk"] == HEADLINE["N"] and not record["causal"]
            and record.get("layer", "kernel") == "kernel" and record.get("mask") in (None, "none"))


def peer_of(dtype):
    return HALF_PEER if dtype in ("float16", "bfloat16") else FP32_PEER


def newest(runs):
    return max(runs, key=lambda run: run[:15])  # yyyymmddThhmmss, then the offset


# --- the registry's speed column ----------------------------------------------------------

def registry_dtype(impl):
    return "float16" if impl == "cuda_mma_f16" else "float32"


def headline_speed(impl):
    """(file, run, card, TFLOP/s at D = 64, at D = 128) of the newest run that timed ``impl``
    at the headline shape at both head dims, or None."""
    found = []
    for name, benchmark in TIMED.items():
        records = [r for r in load(name) if r["benchmark"] == benchmark and r.get("impl") == impl
                   and r["dtype"] == registry_dtype(impl) and at_headline(r)]
        for run in {r["run"] for r in records}:
            of_run = [r for r in records if r["run"] == run]
            d64, d128 = rate(of_run, D=64), rate(of_run, D=128)
            if d64 is not None and d128 is not None:
                found.append((run, name, card(of_run[0]), d64, d128))
    if not found:
        return None
    run, name, gpu, d64, d128 = max(found, key=lambda f: f[0][:15])
    return name, run, gpu, d64, d128


ROW = re.compile(r"^(``\S+``)\s+(.*?)(?:\s+(\d+\.\d\s*/\s*\d+\.\d(?:\s+\S)?))?\s*$")


def registry_table(doc):
    """(start, end, rows) of the docstring's impl table: rows are (name cell, what cell)."""
    lines = doc.split("\n")
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+){2}", line)]
    start, header_end, end = rules[0], rules[1], rules[2]
    rows = []
    for line in lines[header_end + 1:end]:
        m = ROW.match(line)
        rows.append((m.group(1), m.group(2)))
    return start, end, rows


def registry_runs(speeds):
    """{(file, run, card): letter} of the runs the column quotes, lettered in the order of time."""
    runs = sorted({found[:3] for found in speeds if found}, key=lambda r: r[1][:15])
    return {r: "abcdefgh"[i] for i, r in enumerate(runs)}


def registry_legend(runs):
    keys = "; ".join(f"{letter}: notebooks/records/{name}.jsonl, run {run}, {gpu}"
                     + (" (the median of its alternated rounds)" if name == "gpu_steps_chain" else "")
                     for (name, run, gpu), letter in runs.items())
    return textwrap.fill(
        "TFLOP/s: D = 64 / D = 128, B*H = 64, N = 4096, not causal, CUDA events around the kernel; "
        "float32, and float16 for ``cuda_mma_f16``.  Each figure is from the newest run that timed its "
        f"row at that shape, named by its letter ({keys}).  ``python benchmarks/results.py`` writes "
        "this column from the records; the ratios to the peers of the same runs are in "
        "benchmarks/README.md.", width=100)


def render_registry(text):
    """``text`` (course_lib/kernels/__init__.py) with its docstring's speed column and legend rendered."""
    head, quote, rest = text.partition('"""')
    doc, quote, tail = rest.partition('"""')
    lines = doc.split("\n")
    start, end, rows = registry_table(doc)
    speeds = [None if name.startswith("``...") else headline_speed(name.strip("`")) for name, _ in rows]
    runs = registry_runs(speeds)
    cells = [f"{s[3]:.1f} / {s[4]:.1f} {runs[s[:3]]}" if s else "" for s in speeds]
    w1 = max(len(n) for n, _ in rows + [("impl", "")])
    w2 = max(len(w) for _, w in rows + [("", "what it changes")])
    w3 = max(len(c) for c in cells + ["TFLOP/s"])
    rule = f"{'=' * w1}  {'=' * w2}  {'=' * w3}"
    table = [rule, f"{'impl'.ljust(w1)}  {'what it changes'.ljust(w2)}  {'TFLOP/s'.rjust(w3)}", rule]
    table += [f"{n.ljust(w1)}  {w.ljust(w2)}  {c.rjust(w3)}".rstrip() for (n, w), c in zip(rows, cells)]
    lines[start:end + 1] = table + [rule]
    doc = "\n".join(lines)
    legend = doc.index("\nTFLOP/s: ") + 1
    doc = doc[:legend] + registry_legend(runs) + doc[doc.index("\n\n", legend):]
    return head + '"""' + doc + '"""' + tail


# --- benchmarks/README.md's results section -------------------------------------------------

def fmt(x):
    return "-" if x is None else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def runs_of(records, benchmark, **match):
    """{run: its records} of ``benchmark``, oldest run first."""
    out = {}
    for r in records:
        if r["benchmark"] == benchmark and all(r.get(k) == v for k, v in match.items()):
            out.setdefault(r["run"], []).append(r)
    return dict(sorted(out.items(), key=lambda item: item[0][:15]))


def newest_per_card(runs):
    """The newest of ``runs`` ({run: records}) on each card, oldest first."""
    by_card = {}
    for run, records in runs.items():
        by_card[card(records[0])] = run
    return sorted(by_card.values(), key=lambda run: run[:15])


def forward_table(records):
    """Each impl of one run at the headline shape: TFLOP/s at D = 64 / 128 and its ratios to naive
    torch fp32 and to the peer of its dtype."""
    rows = []
    timed = [r for r in records if at_headline(r)]
    for impl, dtype in sorted({(r["impl"], r["dtype"]) for r in timed}, key=lambda k: (k[0].startswith("torch"), k)):
        own = [rate(timed, impl=impl, dtype=dtype, D=d) for d in (64, 128)]
        naive = [rate(timed, impl="torch_naive", dtype="float32", D=d) for d in (64, 128)]
        peer = [rate(timed, impl=peer_of(dtype), dtype=dtype, D=d) for d in (64, 128)]
        to_peer = f"{ratio(own[0], peer[0])} / {ratio(own[1], peer[1])} {PEER_NAMES[peer_of(dtype)]}"
        rows.append([f"`{impl}`", dtype, f"{fmt(own[0])} / {fmt(own[1])}",
                     f"{ratio(own[0], naive[0])} / {ratio(own[1], naive[1])}", to_peer if any(peer) else "-"])
    return markdown_table(["impl", "dtype", "TFLOP/s", "x naive torch fp32", "x peer"], rows)


def causal_table(records):
    """Each impl's causal speed-up: its non-causal time over its causal time, per head dim."""
    rows = []
    for impl, dtype, shape in sorted({(r["impl"], r["dtype"], (r["B"], r["H"], r["Nq"])) for r in records}):
        of = [r for r in records if (r["impl"], r["dtype"], (r["B"], r["H"], r["Nq"])) == (impl, dtype, shape)]
        cells = []
        for d in (64, 128):
            full = [seconds(r) for r in of if r["D"] == d and not r["causal"]]
            causal = [seconds(r) for r in of if r["D"] == d and r["causal"]]
            cells.append(f"{statistics.median(full) / statistics.median(causal):.2f}x" if full and causal else "-")
        rows.append([f"`{impl}`", dtype, f"B*H = {shape[0] * shape[1]}, N = {shape[2]}", " / ".join(cells)])
    return markdown_table(["impl", "dtype", "shape", "causal speed-up, D = 64 / 128"], rows)


def decode_table(records, rules):
    """Split-KV decode at the split count of the run's rule, against one block per row and naive torch."""
    rows = []
    for d in sorted({r["D"] for r in records}):
        at = [r for r in records if r["D"] == d]
        splits = next(r["splits"] for r in rules if r["D"] == d)
        split = rate(at, impl="cuda_split_kv", splits=splits)
        rows.append([d, splits, fmt(split), ratio(split, rate(at, impl="cuda_no_split")),
                     ratio(split, rate(at, impl="torch_naive"))])
    return markdown_table(["D", "splits (the rule's)", "TFLOP/s", "x one block per row", "x naive torch fp32"], rows)


def chapter09_table(records):
    rows = []
    for r in records:
        if r["impl"] == "flash_numba_cuda":
            same = [o for o in records if o["shape"] == r["shape"] and o["causal"] == r["causal"]]
            rows.append(["x".join(map(str, r["shape"])), "causal" if r["causal"] else "none", fmt(r["tflops"]),
                         ratio(r["tflops"], rate(same, impl="torch_naive")),
                         ratio(r["tflops"], rate(same, impl=FP32_PEER))])
    return markdown_table(["B x H x Nq x Nk x D", "mask", "TFLOP/s", "x naive torch fp32", "x SDPA efficient"], rows)


def backward_table(records):
    rows = []
    for r in records:
        if not r["impl"].startswith("torch"):
            same = [o for o in records if o["shape"] == r["shape"] and o["causal"] == r["causal"]]
            peer = peer_of(r["dtype"])
            rows.append([f"`{r['impl']}`", r["dtype"], "x".join(map(str, r["shape"])),
                         "causal" if r["causal"] else "none", fmt(r["tflops"]),
                         f"{ratio(r['tflops'], rate(same, impl=peer, dtype=r['dtype']))} {PEER_NAMES[peer]}"])
    return markdown_table(["impl", "dtype", "B x H x N x N x D", "mask", "TFLOP/s", "x peer's backward"], rows)


def chapter_reads():
    """{chapter notebook: the records files its code cells name}."""
    names = {p.stem for p in RECORDS.glob("*.jsonl")}
    out = {}
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "code")
        read = sorted(n for n in names if re.search(rf"\b{re.escape(n)}\.jsonl\b", code))
        if read:
            out[path.stem] = read
    return out


def records_table():
    rows = []
    for path in sorted(RECORDS.glob("*.jsonl")):
        records = load(path.stem)
        runs = sorted({r["run"] for r in records}, key=lambda run: run[:15])
        cards = sorted({card(r) for r in records})
        rows.append([f"`{path.name}`", len(records), len(runs), runs[-1], ", ".join(cards)])
    return markdown_table(["file", "records", "runs", "newest run", "machines"], rows)


def heading(records, what):
    return f"{what}: run {records[0]['run']}, {card(records[0])}."


def render_results():
    """The results section of benchmarks/README.md, from the records."""
    parts = ["### Which records each chapter reads", "",
             markdown_table(["chapter", "records (notebooks/records/)"],
                            [[stem, ", ".join(f"`{n}.jsonl`" for n in names)] for stem, names in chapter_reads().items()]),
             "", "### Every records file", "", records_table(), ""]
    steps, chain, mma = load("gpu_steps"), load("gpu_steps_chain"), load("gpu_mma")
    parts += ["### Forward, B*H = 64, N = 4096, not causal (chapters 10 and 11)", ""]
    for name, records, benchmark, runs in (
            ("gpu_steps.jsonl", steps, "gpu_steps", None), ("gpu_steps_chain.jsonl", chain, "gpu_steps_chain", None),
            ("gpu_mma.jsonl", mma, "gpu_mma_time", "newest per card")):
        by_run = runs_of(records, benchmark)
        for run in (newest_per_card(by_run) if runs else list(by_run)):
            parts += [heading(by_run[run], f"`{name}`, `{benchmark}`"), "", forward_table(by_run[run]), ""]
    parts += ["### Causal against no mask (chapters 10 and 11)", ""]
    for name, records, benchmark in (("gpu_steps.jsonl", steps, "gpu_steps_causal"),
                                     ("gpu_mma.jsonl", mma, "gpu_mma_causal")):
        by_run = runs_of(records, benchmark)
        for run in newest_per_card(by_run):
            parts += [heading(by_run[run], f"`{name}`, `{benchmark}`"), "", causal_table(by_run[run]), ""]
    by_run = runs_of(steps, "gpu_steps_decode")
    for run in newest_per_card(by_run):
        parts += ["### Split-KV decode, Nq = 1, Nk = 32768, batch 8, 16 heads (chapter 10)", "",
                  heading(by_run[run], "`gpu_steps.jsonl`, `gpu_steps_decode`"), "",
                  decode_table(by_run[run], runs_of(steps, "gpu_steps_decode_rule")[run]), ""]
    by_run = runs_of(load("gpu_attention"), "gpu_attention")
    run = newest(by_run)
    parts += ["### Chapter 09's kernel, float32", "", heading(by_run[run], "`gpu_attention.jsonl`"), "",
              chapter09_table(by_run[run]), ""]
    backward = load("gpu_backward")
    parts += ["### Backward (chapter 12)", ""]
    by_run = runs_of([r for r in backward if "variant" not in r], "gpu_backward_time")
    for run in newest_per_card(by_run):
        checks = [r for r in backward if r["run"] == run and r["benchmark"] == "gpu_backward_check"]
        passed = sum(r["verdict"] == "PASS" for r in checks)
        parts += [heading(by_run[run], "`gpu_backward.jsonl`") + f" Checks on the GPU: {passed} of {len(checks)} pass.",
                  "", backward_table(by_run[run]), ""]
    return "\n".join(parts).rstrip() + "\n"


def render_readme(text):
    before, _, rest = text.partition(BEGIN)
    _, _, after = rest.partition(END)
    return before + BEGIN + "\n" + render_results() + END + after


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, render in ((README, render_readme), (REGISTRY, render_registry)):
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(fresh)
    verb = "differs from the records" if args.check else "rewritten from the records"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
