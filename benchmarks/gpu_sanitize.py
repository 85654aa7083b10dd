"""Chapter 10's micro-tiled kernels under NVIDIA's compute-sanitizer, one record per tool.

    python benchmarks/gpu_sanitize.py [--tuned notebooks/records/gpu_steps.jsonl] [--tools memcheck racecheck]

For each tool it runs ``benchmarks/gpu_steps.py --parts sanitize`` (small launches of every
micro-tiled step and of split-KV decode, each checked against the float64 reference) under
``compute-sanitizer --tool TOOL`` in a process of its own, and appends to
``notebooks/records/gpu_steps_sanitize.jsonl`` that part's record plus the tool's command and
its summary lines.  The simulator runs one thread at a time and can hide a race: this is where
races, out-of-bounds accesses and barrier misuse would show.  A record of a run, not a test.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib import bench

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "notebooks" / "records" / "gpu_steps_sanitize.jsonl"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", nargs="+", default=["memcheck", "racecheck", "synccheck"])
    parser.add_argument("--tuned", default=None)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    for tool in args.tools:
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part.jsonl"
            cmd = ["compute-sanitizer", "--tool", tool, sys.executable, "benchmarks/gpu_steps.py", "--parts",
                   "sanitize", "--out", str(part)] + (["--tuned", args.tuned] if args.tuned else [])
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
            output = run.stdout + run.stderr
            summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: [^\n]*", output)
            records = [json.loads(line) for line in part.read_text().splitlines()] if part.exists() else []
            rec = records[-1] if records else {"benchmark": "gpu_steps_sanitize", "checks": [],
                                               "error": output[-2000:]}
            rec.update(tool=" ".join(["compute-sanitizer", "--tool", tool, "python3", *cmd[4:]]).replace(tmp, "TMP"),
                       summary=summary, returncode=run.returncode)
            bench.write_records(args.out, [rec])
            print(tool, summary, f"rc={run.returncode}", f"{len(rec.get('checks', []))} checks", flush=True)


if __name__ == "__main__":
    main()
