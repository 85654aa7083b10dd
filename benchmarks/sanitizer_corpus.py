"""Hold cudacheck against NVIDIA's compute-sanitizer on the corpus of planted bugs (chapter 09).

    python benchmarks/sanitizer_corpus.py                     # on a machine with a GPU and compute-sanitizer
    python benchmarks/sanitizer_corpus.py --cases reverse_no_barrier --tools racecheck

For every kernel of ``course_lib.cudacheck.corpus`` (the buggy one and its
fixed twin) it runs one launch on the GPU under each compute-sanitizer tool
(racecheck, memcheck, initcheck, synccheck), each in a process of its own
(a memcheck error leaves the CUDA context unusable), and once more without a
sanitizer to see whether the GPU's answer matches the numpy spec anyway.  It
runs cudacheck on the same kernels, then appends one record per (kernel,
variant, tool) to ``notebooks/records/sanitizer_corpus.jsonl``: what the tool
flagged, what cudacheck flagged, and the date, GPU, driver, CUDA,
compute-sanitizer, numba and numba-cuda versions.
``course_lib.cudacheck.sanitizer_record.comparison_table()`` renders it.

``--launch CASE VARIANT`` is the one launch each of those processes runs.
This is a record of a run, not a test: CI never runs it.
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from course_lib import bench, cudacheck
from course_lib.cudacheck.corpus import CASES, case
from course_lib.cudacheck.sanitizer_record import RECORD, TOOL_OF_KIND, TOOLS

HERE = Path(__file__).resolve()

MATCH, DIFFER = "LAUNCH MATCHES SPEC", "LAUNCH DIFFERS FROM SPEC"


# ----------------------------------------------------------- one launch


def launch(name, variant):
    """Run one corpus kernel on the GPU (what each sanitizer process runs); print whether it met the spec."""
    import numpy as np
    from numba import cuda

    c = case(name)
    host = c.args()
    on_device = {}   # one cudacheck.to_device stand-in passed twice (or sliced) is one device array here too
    for a in host:
        if isinstance(a, cudacheck.DeviceArray) and id(a.root) not in on_device:
            on_device[id(a.root)] = cuda.to_device(a.root.copy_to_host())
    dev = [cuda.device_array(a.shape, a.dtype) if isinstance(a, cudacheck.Uninitialized)
           else (on_device[id(a.root)] if a.root is a else on_device[id(a.root)][a.index])
           if isinstance(a, cudacheck.DeviceArray)
           else cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in host]
    getattr(c, variant)[c.griddim, c.blockdim](*dev)
    cuda.synchronize()
    print("LAUNCHED", flush=True)
    if os.environ.get("CORPUS_COMPARE") == "1":   # only outside a sanitizer: copying back unwritten memory
        fresh = c.args()                          # would be an initcheck error of its own
        spec_args = [np.zeros(a.shape, a.dtype) if isinstance(a, cudacheck.Uninitialized) else a for a in fresh]
        same = all(np.allclose(dev[pos].copy_to_host(), want, rtol=1e-4, atol=1e-4, equal_nan=False)
                   for pos, want in c.spec(*spec_args).items())
        print(MATCH if same else DIFFER, flush=True)


# ------------------------------------------------- reading the sanitizer


def parse_sanitizer(output, returncode, tool):
    """What one compute-sanitizer run said: {status, flagged, errors, hazards, messages, exit_code}."""
    errors = re.search(r"ERROR SUMMARY: (\d+) error", output)
    hazards = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", output)
    messages = []
    for line in output.splitlines():
        text = line.strip("= ").strip()
        if re.match(r"(Invalid|Race reported|Uninitialized|Barrier error|Error|Warning|Potential|"
                    r"Program hit|Malformed|Misaligned|Out of bounds|Unspecified launch failure)", text):
            text = re.sub(r"0x[0-9a-fA-F]+", "ADDR", text)
            if text not in messages and len(messages) < 4:
                messages.append(text)
    # racecheck ends with its own summary (hazards: errors and warnings), the other tools with ERROR SUMMARY
    n_errors = int(errors.group(1)) if errors else int(hazards.group(2)) if hazards else None
    n_hazards = int(hazards.group(1)) if hazards else 0
    status = "ok" if errors or hazards else "fault" if "CUDA_ERROR_" in output else "crashed"
    return {"status": status, "flagged": bool(n_errors or n_hazards), "errors": n_errors, "hazards": n_hazards,
            "messages": messages, "exit_code": returncode, "launched": "LAUNCHED" in output}


def run_one(cmd, timeout, env=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True)
        return p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out + "\nTIMEOUT", None


# ------------------------------------------------------------ the record


def environment(sanitizer):
    from numba import cuda

    def shell(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    gpu = shell("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader").strip().split(", ")
    version = re.search(r"Version (\S+)", shell(sanitizer, "--version"))
    nvcc = re.search(r"release ([\d.]+)", shell("nvcc", "--version"))
    try:
        driver_cuda = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    except Exception:  # noqa: BLE001 - no driver (a dry run): say so
        driver_cuda = "none"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "gpu": gpu[0] if gpu[0] else "none", "driver": gpu[1] if len(gpu) > 1 else "none",
        "cuda": driver_cuda, "nvcc": nvcc.group(1) if nvcc else "none",
        "compute_sanitizer": version.group(1) if version else "none",
        "python": platform.python_version(),
        **{name: metadata.version(name) for name in ("numpy", "numba", "numba-cuda")},
    }


def cudacheck_verdict(c, variant):
    report = cudacheck.check(getattr(c, variant), c.griddim, c.blockdim, *c.args())
    return {"kinds": sorted(report.kinds), "findings": [str(f).split(". ")[0] for f in report.findings]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", nargs=2, metavar=("CASE", "VARIANT"), help="run one launch and exit")
    parser.add_argument("--cases", nargs="+", default=[c.name for c in CASES])
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--sanitizer", default="compute-sanitizer", help="the compute-sanitizer executable")
    parser.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--timeout", type=float, default=120, help="seconds for one sanitizer process")
    parser.add_argument("--out", type=Path, default=RECORD)
    parser.add_argument("--table", type=Path, help="also write the comparison table (markdown) here")
    args = parser.parse_args(argv)
    if args.launch:
        return launch(*args.launch)

    env = environment(args.sanitizer)
    run = datetime.datetime.now().astimezone().strftime("%Y%m%dT%H%M%S%z")
    print(f"run {run}: {env['gpu']}, driver {env['driver']}, CUDA {env['cuda']}, "
          f"compute-sanitizer {env['compute_sanitizer']}, numba {env['numba']}, numba-cuda {env['numba-cuda']}")
    cases = [case(name) for name in args.cases]
    me = [sys.executable, str(HERE), "--launch"]
    jobs = {}
    for c in cases:
        for variant in ("buggy", "fixed"):
            for tool in args.tools:
                jobs[(c.name, variant, tool)] = [args.sanitizer, "--tool", tool, "--print-limit", "20",
                                                 *me, c.name, variant]
            jobs[(c.name, variant, "plain")] = [*me, c.name, variant]
    plain_env = {**os.environ, "CORPUS_COMPARE": "1"}
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {key: pool.submit(run_one, cmd, args.timeout, plain_env if key[2] == "plain" else None)
                   for key, cmd in jobs.items()}
        outputs = {key: f.result() for key, f in futures.items()}

    print(f"{'kernel':34} {'variant':7} " + " ".join(f"{t:>10}" for t in args.tools) + "  cudacheck / plain run")
    with bench.RecordFile(args.out) as out:
        for c in cases:
            for variant in ("buggy", "fixed"):
                verdict = cudacheck_verdict(c, variant)
                out, rc = outputs[(c.name, variant, "plain")]
                plain = {"status": "timeout" if rc is None else "ok" if "LAUNCHED" in out
                         else "fault" if "CUDA_ERROR_" in out else "crashed",
                         "matches_spec": True if MATCH in out else False if DIFFER in out else None,
                         "exit_code": rc}
                reports = {}
                for tool in args.tools:
                    out, rc = outputs[(c.name, variant, tool)]
                    san = reports[tool] = parse_sanitizer(out, rc, tool)
                    if rc is None:
                        san["status"] = "timeout"
                    if san["status"] != "ok":
                        san["tail"] = out[-1500:]
                flagged_by = [tool for tool, san in reports.items() if san["flagged"]]
                # said in so many words: the bugs the sanitizer missed, and the twins someone flagged
                summary = {"sanitizer_flagged_by": flagged_by, "cudacheck_flagged": bool(verdict["kinds"]),
                           "sanitizer_missed_it": variant == "buggy" and not flagged_by,
                           "cudacheck_missed_it": bool(flagged_by) and not verdict["kinds"],
                           "blind_spot": c.blind_spot if variant == "buggy" and not flagged_by else ""}
                for tool, san in reports.items():
                    rec = {"benchmark": "sanitizer_corpus", "run": run, "case": c.name, "bug": c.bug,
                           "variant": variant, "expect": c.expect, "tool": tool, "sanitizer": san,
                           "cudacheck": {**verdict, "tool_kinds": [k for k in verdict["kinds"]
                                                                   if TOOL_OF_KIND[k] == tool]},
                           "summary": summary, "plain_run": plain, "griddim": c.griddim,
                           "blockdim": c.blockdim, "environment": env}
                    out.write(rec)
                cells = ["timeout" if san["status"] == "timeout" else san["status"] if san["status"] != "ok"
                         else f"{san['errors']}+{san['hazards']}" if san["flagged"] else "-"
                         for san in reports.values()]
                print(f"{c.name:34} {variant:7} " + " ".join(f"{x:>10}" for x in cells) +
                      f"  {','.join(verdict['kinds']) or '-'} / {plain['status']}, spec {plain['matches_spec']}")
    print(f"records appended to {args.out}")
    if args.table:
        from course_lib.cudacheck.sanitizer_record import comparison_table
        args.table.write_text(comparison_table(args.out) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
