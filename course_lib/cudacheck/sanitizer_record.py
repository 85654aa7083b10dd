"""What NVIDIA's compute-sanitizer said of the corpus on a GPU, beside what cudacheck said.

``benchmarks/sanitizer_corpus.py`` runs every kernel of ``corpus.CASES`` (the
buggy one and its fixed twin) under each tool (racecheck, memcheck, initcheck,
synccheck) and appends one line per case, variant and tool to ``RECORD``;
``comparison_table()`` renders the latest run for chapter 09.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import check
from .corpus import CASES

RECORD = Path(__file__).resolve().parents[2] / "notebooks" / "records" / "sanitizer_corpus.jsonl"
TOOLS = ("racecheck", "memcheck", "initcheck", "synccheck")
TOOL_OF_KIND = {"race": "racecheck", "out_of_bounds": "memcheck", "uninitialized": "initcheck",
                "barrier": "synccheck", "integer_overflow": None}   # no tool checks integer arithmetic


def load_record(path=RECORD, *, every_run=False) -> list:
    """The latest run's lines of the sanitizer record (one per case, variant and tool), or every run's."""
    with Path(path).open(encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no records; run benchmarks/sanitizer_corpus.py on a GPU machine")
    last = lines[-1]["run"]
    return lines if every_run else [r for r in lines if r["run"] == last]


def _gpu_answer(runs):
    """'right anyway', 'wrong', or 'wrong in 1 of 2 runs': a race shows on the hardware only now and then."""
    words = [r["status"] if r["status"] != "ok" else {True: "right anyway", False: "wrong", None: "?"}
             [r["matches_spec"]] for r in runs]
    if len(set(words)) == 1:
        return words[0]
    return f"wrong in {words.count('wrong')} of {len(words)} runs"


def comparison_table(path=RECORD) -> str:
    """Markdown: per planted bug, what each compute-sanitizer tool and cudacheck flagged, with the run's versions.

    A cell reads `flagged (n)` (the tool reported n errors), `-` (nothing), or
    `crashed` / `fault` / `timeout`; `fixed twin` says whether every tool and
    cudacheck passed it; the last column, whether the buggy kernel's answer on
    the GPU (run without a sanitizer) was right anyway, a bug that did not show,
    over every run of the record on that GPU.  The tools' columns are the latest run's; a case
    added since reads `no verdict yet` there, beside cudacheck's verdict of today.
    """
    records, every = load_record(path), load_record(path, every_run=True)
    env = records[0]["environment"]
    by = {(r["case"], r["variant"], r["tool"]): r for r in records}
    names = list(dict.fromkeys(r["case"] for r in records))
    head = (f"Measured on {env['date'][:10]}: {env['gpu']}, driver {env['driver']}, CUDA {env['cuda']}, "
            f"compute-sanitizer {env['compute_sanitizer']}, numba {env['numba']}, "
            f"numba-cuda {env['numba-cuda']} (`{Path(path).name}`).\n\n")
    rows = ["| kernel (planted bug) | " + " | ".join(TOOLS) + " | cudacheck | fixed twin | buggy answer on the GPU |",
            "|---" * (len(TOOLS) + 4) + "|"]
    for name in names:
        buggy = [by[(name, "buggy", tool)] for tool in TOOLS]
        fixed = [by[(name, "fixed", tool)] for tool in TOOLS]
        cells = [_cell(r["sanitizer"]) for r in buggy]
        kinds = buggy[0]["cudacheck"]["kinds"]
        clean = all(not r["sanitizer"]["flagged"] and r["sanitizer"]["status"] == "ok" for r in fixed) and \
            not fixed[0]["cudacheck"]["kinds"]
        answer = _gpu_answer([r["plain_run"] for r in every if (r["case"], r["variant"], r["tool"]) ==
                              (name, "buggy", TOOLS[0]) and r["environment"]["gpu"] == env["gpu"]])
        rows.append(f"| `{name}` ({buggy[0]['bug']}) | " + " | ".join(cells) +
                    f" | {', '.join(kinds) or '-'} | {'all clean' if clean else 'NOT clean'} | {answer} |")
    for c in CASES:   # cases added since the run on the GPU: cudacheck's verdict now, the tools' still to come
        if c.name not in names:
            buggy, fixed = (check(getattr(c, v), c.griddim, c.blockdim, *c.args()) for v in ("buggy", "fixed"))
            rows.append(f"| `{c.name}` ({c.bug}) | " + " | ".join("no verdict yet" for _ in TOOLS) +
                        f" | {', '.join(sorted(buggy.kinds)) or '-'} | "
                        f"{'cudacheck clean, tools not run' if fixed.ok else 'NOT clean'} | not run yet |")
    missed = [n for n in names if not any(by[(n, "buggy", t)]["sanitizer"]["flagged"] for t in TOOLS)]
    foot = ""
    if missed:
        caught = [n for n in missed if by[(n, "buggy", TOOLS[0])]["cudacheck"]["kinds"]]
        foot = (f"\n\ncompute-sanitizer flagged nothing in {len(missed)} of {len(names)} planted bugs; "
                f"cudacheck flagged {len(caught)} of those {len(missed)}:\n")
        for n in missed:
            known = {c.name: c.blind_spot for c in CASES}.get(n) or "no tool reported an error on this GPU"
            foot += f"\n- `{n}`: {known}."
    new = [c.name for c in CASES if c.name not in names]
    if new:
        foot += (f"\n\n{len(new)} cases added since this run have no compute-sanitizer verdict yet: "
                 f"{', '.join(f'`{n}`' for n in new)}.")
    return head + "\n".join(rows) + foot


def _cell(s):
    if s["status"] != "ok":
        return s["status"]
    return f"flagged ({s['errors']})" if s["flagged"] else "-"
