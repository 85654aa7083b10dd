"""The regression matrix (``python -m course_lib.bench --matrix``): every bucket is measured on every
path, and a regression is flagged from the records alone, beyond the noise the runs measured.

The buckets are tiny (the timings are noise-sized; no test asserts a speed), except in the planted
fallback, where the fallback computes 30x the work of the kernel it replaces."""
import copy
import json

import numba
import numpy as np
import pytest

from course_lib import api
from course_lib.bench import cli
from course_lib.bench import matrix as mx

TINY = dict(lengths={"chat": 16}, heads=1, head_dim=8, dtypes=("float32", "bfloat16"))


@pytest.fixture(scope="module")
def tiny_run():
    return mx.run(mx.buckets(**TINY), rounds=3, progress=False)


def test_every_bucket_has_one_record_per_path_with_its_rounds_and_error(tiny_run):
    todo = mx.buckets(**TINY)
    assert len(todo) == 2 * 2 * 3   # prefill and decode, two precisions, three masks
    assert len(tiny_run) == 3 * len(todo)
    assert {mx.key_of(r) for r in tiny_run} == {b.key() + (p,) for b in todo for p in mx.PATHS}
    for r in tiny_run:
        assert r["rounds"] == 3 and len(r["times_ms"]) == 3
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["noise"] >= 0
        bound = 0.0 if r["path"] == "reference" else (1e-5 if r["dtype"] == "float32" else 3e-2)
        assert r["max_abs_err"] <= bound, r
    public = [r for r in tiny_run if r["path"] == "public"]
    assert all(r["ran"].startswith("torch_sdpa_flash") and not r["fallback"] for r in public)
    assert all("mask tensor" in r["ran"] for r in public if r["mask"] == "window")


def test_a_run_compared_with_itself_flags_nothing(tiny_run):
    assert mx.compare(tiny_run, tiny_run) == []


def test_the_reference_refuses_past_its_memory_and_the_report_says_how_far_each_path_went(monkeypatch):
    monkeypatch.setattr(mx, "REFERENCE_BYTES", 2 * 4 * 1 * 24 * 24 * 8 - 1)   # one byte short of 24 x 24 at B = 4
    todo = mx.buckets(lengths={"chat": 24}, heads=1, head_dim=8, dtypes=("float32",), masks=("causal",))
    records = mx.run(todo, rounds=1, progress=False)
    prefill, decode = ({r["path"]: r for r in records if r["bucket"] == kind} for kind in ("prefill", "decode"))
    assert prefill["reference"]["median_ms"] is None and "exceed" in prefill["reference"]["refused"]
    assert prefill["native"]["max_abs_err"] < 1e-5   # measured against the float64 tiles instead
    assert decode["reference"]["median_ms"] is not None
    table = mx.report(records)
    assert "refused: S and P in float64" in table
    assert "reference 24; public 24; native 24" in table   # decode ran it at Nk = 24


def _rerun(records, run_id, times):
    """``records`` as another run whose rounds took ``times(record)`` ms."""
    out = []
    for r in copy.deepcopy(records):
        r["run"] = r["run_id"] = run_id
        if r.get("times_ms"):
            ms = [float(t) for t in times(r)]
            med = float(np.median(ms))
            r.update(times_ms=ms, min_ms=min(ms), median_ms=med, max_ms=max(ms), spread=max(ms) / min(ms) - 1,
                     noise=med / min(ms) - 1)
        out.append(r)
    return out


def test_a_noisy_but_unchanged_run_is_not_flagged_and_a_planted_slowdown_is(tiny_run):
    rng = np.random.default_rng(16)
    quiet = _rerun(tiny_run, "quiet", lambda r: [1.00, 1.04, 1.08])   # 4% noise: the floor's 10% decides
    # the load only adds time: rounds up to 80% slower, one of each bucket undisturbed
    noisy = _rerun(tiny_run, "noisy", lambda r: [1.0] + list(1 + 0.8 * rng.random(2)))
    assert mx.compare(quiet, noisy) == []
    assert mx.compare(noisy, quiet) == []
    planted = _rerun(tiny_run, "planted", lambda r: [3.0, 3.1, 3.2] if (r["path"], r["mask"], r["dtype"], r["bucket"]) ==
                     ("native", "window", "bfloat16", "prefill") else [1.0, 1.04, 1.08])
    flagged = mx.compare(quiet, planted)
    assert [(f["record"]["path"], f["record"]["mask"], f["what"]) for f in flagged] == [("native", "window", "time")]
    assert "REGRESSION" in mx.format_regressions(flagged, "quiet")
    # the same slowdown in a run as noisy as the slowdown itself is within what its noise allows
    very_noisy = _rerun(tiny_run, "very noisy", lambda r: [1.0, 4.0, 4.0])
    assert mx.compare(very_noisy, planted) == []


def test_a_new_refusal_a_new_fallback_and_a_grown_error_are_flagged(tiny_run):
    later = _rerun(tiny_run, "later", lambda r: r["times_ms"])
    victims = [r for r in later if r["path"] == "public" and r["bucket"] == "prefill" and r["dtype"] == "float32"]
    none, causal, window = sorted(victims, key=lambda r: mx.MASKS.index(r["mask"]))
    none.update(median_ms=None, refused="RuntimeError: out of memory")
    causal.update(fallback=True, ran="torch_sdpa_math (fallback: flash refused: no)")
    window["max_abs_err"] = 1e-3
    assert sorted((f["record"]["mask"], f["what"]) for f in mx.compare(tiny_run, later)) == [
        ("causal", "fallback"), ("none", "refused, ran before"), ("window", "error")]


def test_a_kernel_that_falls_back_to_naive_for_one_mask_is_flagged_from_the_records(tmp_path):
    todo = mx.buckets(lengths={"summarise": 4096}, heads=1, head_dim=32, dtypes=("float32",),
                      masks=("none", "window"), kinds=("prefill",))

    def planted(bucket, q, k, v):   # flash_numba_cpu, except that a window silently goes the naive way
        impl = "naive" if bucket.mask == "window" else mx.NATIVE
        return (lambda: api.attention(q, k, v, impl=impl, causal=bucket.causal, window_size=bucket.window_size)), \
            mx.NATIVE
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    # One numba thread: beside the CI's other test worker, a 2-thread prange waits for a busy core at its barrier
    # and runs several times slower in every round (the planted slowdown then hid in it twice); on one thread
    # both runs meet the neighbour alike.  5 rounds, so that a noisy round or two cannot hide it either.
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        mx.run(todo, out=before, rounds=5, progress=False)
        mx.run(todo, out=after, paths={**mx.DEFAULT_PATHS, "native": planted}, rounds=5, progress=False)
    finally:
        numba.set_num_threads(threads)
    flagged = mx.compare(cli.load_records(before), cli.load_records(after))
    native = [(f["record"]["mask"], f["what"]) for f in flagged if f["record"]["path"] == "native"]
    seen = {(name, r["path"], r["mask"]): (r["min_ms"], round(r["noise"], 2))
            for name, path in (("before", before), ("after", after)) for r in cli.load_records(path)}
    assert native == [("window", "time")], f"{mx.format_regressions(flagged, 'before')}\n(fastest ms, noise): {seen}"


def test_the_cli_writes_the_records_and_exits_1_on_a_regression(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mx, "buckets", lambda quick: [mx.Bucket("chat", "decode", 2, 1, 1, 16, 8, "float32", "none")])
    out = tmp_path / "m.jsonl"
    assert cli.main(["--matrix", "--quick", "--quiet", "--rounds", "2", "--out", str(out)]) == 0
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in first] == list(mx.PATHS)
    slow = tmp_path / "slow.jsonl"   # a committed run in which everything was 100x faster than now
    slow.write_text("".join(json.dumps({**r, "run": "old", "run_id": "old", "min_ms": r["min_ms"] / 100,
                                        "median_ms": r["median_ms"] / 100, "noise": 0.0}) + "\n" for r in first))
    assert cli.main(["--matrix", "--quiet", "--rounds", "2", "--out", str(out), "--compare", str(slow)]) == 1
    assert "REGRESSION" in capsys.readouterr().out


def test_the_gpu_records_are_shown_in_the_matrixs_terms_where_they_exist():
    table = mx.gpu_report(cli.load_records(cli.DEFAULT_OUT))
    lines = table.splitlines()
    assert lines[0].startswith("GPU records: run") and "H200" in lines[0]
    native = [line for line in lines[1:] if " native " in line]
    assert any("32768" in line and "float32" in line and " ms" in line for line in native)
    assert all("not applicable" in line for line in native if "float16" in line)   # chapter 10's kernel is fp32 only
    assert not any("not applicable" in line for line in lines[1:] if " public " in line)
