"""The regression matrix (``python -m course_lib.bench --matrix``): every bucket is measured on every
path, and a regression is flagged from the records alone, beyond the noise the runs measured.

The buckets are tiny (the timings are noise-sized; no test asserts a speed), except in the planted
fallback, where the fallback computes 30x the work of the kernel it replaces."""
import copy
import json
import subprocess
import sys

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


def test_a_run_compared_with_its_own_copy_flags_nothing_and_drifts_not(tiny_run):
    same = mx.compare(*(_rerun(tiny_run, name, lambda r: r["times_ms"]) for name in ("run", "copy")))
    assert same.flagged == [] and same.untimed == "" and same.drift == 1.0 and same.timed == len(tiny_run)
    assert mx.compare(tiny_run, tiny_run).baseline is None   # a run is never its own baseline


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
    """``records`` as another run, on a quiet machine, whose rounds took ``times(record)`` ms."""
    out = []
    for r in copy.deepcopy(records):
        r["run"] = r["run_id"] = run_id
        r["environment"].update(load_average=[0.5, 0.5, 0.5], load_average_end=[0.5, 0.5, 0.5])   # a quiet machine
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
    assert mx.compare(quiet, noisy).flagged == []
    assert mx.compare(noisy, quiet).flagged == []
    planted = _rerun(tiny_run, "planted", lambda r: [3.0, 3.1, 3.2] if (r["path"], r["mask"], r["dtype"], r["bucket"]) ==
                     ("native", "window", "bfloat16", "prefill") else [1.0, 1.04, 1.08])
    found = mx.compare(quiet, planted)
    assert [(f["record"]["path"], f["record"]["mask"], f["what"]) for f in found.flagged] == [("native", "window", "time")]
    assert "REGRESSION" in mx.format_regressions(found)
    # the same slowdown in a run as noisy as the slowdown itself is within what its noise allows
    very_noisy = _rerun(tiny_run, "very noisy", lambda r: [1.0, 4.0, 4.0])
    assert mx.compare(very_noisy, planted).flagged == []


def test_a_load_that_stays_for_the_whole_run_is_drift_not_92_regressions(tiny_run):
    """Another user's job for the whole run slows every round alike and leaves no noise: a rule on the
    noise alone flags every bucket (a learner saw 92 REGRESSION lines); the drift takes it out."""
    quiet = _rerun(tiny_run, "quiet", lambda r: [1.00, 1.01, 1.02])
    rng = np.random.default_rng(41)
    loaded = _rerun(tiny_run, "loaded", lambda r: 2.0 * (1 + 0.05 * rng.random()) * np.array([1.00, 1.01, 1.02]))
    found = mx.compare(quiet, loaded)
    assert found.flagged == [] and 2.0 <= found.drift <= 2.1
    assert "every path is slower alike" in mx.format_regressions(found)
    planted = _rerun(tiny_run, "loaded, planted", lambda r: (6.0 if (r["path"], r["mask"], r["dtype"], r["bucket"]) ==
                     ("native", "window", "bfloat16", "prefill") else 2.0) * np.array([1.00, 1.01, 1.02]))
    found = mx.compare(quiet, planted)
    assert [(f["record"]["path"], f["record"]["mask"], f["what"]) for f in found.flagged] == [("native", "window", "time")]
    # without the drift (the old rule: over the noise alone) the same loaded run flags every timed record
    drift_blind = [r for (o, r) in zip(quiet, loaded) if r.get("min_ms") and r["min_ms"] / o["min_ms"] > mx.threshold(o, r)]
    assert len(drift_blind) == found.timed


def test_times_are_held_only_against_a_run_of_the_same_machine(tiny_run):
    """Same name, another chip: the CPU string "AMD EPYC" matched, the family / model / flags did not."""
    slow = _rerun(tiny_run, "later", lambda r: [5.0, 5.0, 5.0] if r["path"] == "native" else [1.0, 1.0, 1.0])
    for r in slow:
        r["environment"] = {**r["environment"], "cpu_identity": {**r["environment"]["cpu_identity"],
                                                                 "flags_sha": "another chip"}}
    window = next(r for r in slow if r["path"] == "native" and r["mask"] == "window")
    window["max_abs_err"] = 1.0
    found = mx.compare(_rerun(tiny_run, "then", lambda r: [1.0, 1.0, 1.0]), slow)
    assert "flags_sha" in found.untimed and found.timed == 0
    assert [(f["record"]["mask"], f["what"]) for f in found.flagged] == [("window", "error")]   # errors still count
    assert "times not compared: not the same machine" in mx.format_regressions(found)
    for r in slow:
        del r["environment"]["cpu_identity"]
    assert "not recorded" in mx.compare(tiny_run, slow).untimed


def test_times_of_a_run_on_an_oversubscribed_machine_are_not_judged(tiny_run):
    """Above LOAD_LIMIT runnable threads a core the load changes from bucket to bucket faster than three
    rounds see (beside two busy loops a run of the same code had buckets slower than the noise allows, some
    even over the drift).  Such a run's times are not compared; its errors are."""
    then = _rerun(tiny_run, "then", lambda r: [1.0, 1.0, 1.0])
    busy = _rerun(tiny_run, "busy", lambda r: [9.0, 9.0, 9.0] if r["path"] == "native" else [1.0, 1.0, 1.0])
    for r in busy:
        r["environment"].update(load_average=[4.0, 4.0, 4.0])
    busy[0]["max_abs_err"] = 1.0
    found = mx.compare(then, busy)
    assert found.timed == 0 and "runnable threads per core" in found.untimed
    assert [f["what"] for f in found.flagged] == ["error"]
    for r in busy:   # the same load met by both versions in interleaved rounds: judged
        r["environment"]["interleaved_with"] = "stamp"
    for r in then:
        r["environment"]["interleaved_with"] = "stamp"
    assert {f["record"]["path"] for f in mx.compare(then, busy).flagged if f["what"] == "time"} == {"native"}


def test_a_new_refusal_a_new_fallback_and_a_grown_error_are_flagged(tiny_run):
    later = _rerun(tiny_run, "later", lambda r: r["times_ms"])
    victims = [r for r in later if r["path"] == "public" and r["bucket"] == "prefill" and r["dtype"] == "float32"]
    none, causal, window = sorted(victims, key=lambda r: mx.MASKS.index(r["mask"]))
    none.update(median_ms=None, refused="RuntimeError: out of memory")
    causal.update(fallback=True, ran="torch_sdpa_math (fallback: flash refused: no)")
    window["max_abs_err"] = 1e-3
    assert sorted((f["record"]["mask"], f["what"]) for f in mx.compare(tiny_run, later).flagged) == [
        ("causal", "fallback"), ("none", "refused, ran before"), ("window", "error")]


def _fallback_for_windows(bucket, q, k, v):   # flash_numba_cpu, except that a window silently goes the naive way
    impl = "naive" if bucket.mask == "window" else mx.NATIVE
    return (lambda: api.attention(q, k, v, impl=impl, causal=bucket.causal, window_size=bucket.window_size)), mx.NATIVE


@pytest.fixture
def cpu_hog():
    """A process that keeps one core busy for as long as the test runs: another user's job."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait()


def test_a_kernel_that_falls_back_to_naive_for_one_mask_is_flagged_alone_beside_a_cpu_hog(tmp_path, cpu_hog):
    """Chapter 16's planted regression, the two versions in interleaved rounds, with a busy-loop process
    taking a core all the while (numba keeps its threads: a prange waits for the busy core at its barrier):
    the window bucket of the native path is flagged, and nothing else is."""
    todo = mx.buckets(lengths={"summarise": 2048}, heads=1, head_dim=32, dtypes=("float32",),
                      masks=("none", "window"), kinds=("prefill",))
    before, after = mx.run_pair(todo, after={**mx.DEFAULT_PATHS, "native": _fallback_for_windows}, rounds=5,
                                progress=False)
    assert cpu_hog.poll() is None   # it ran all along
    mx.write_records(tmp_path / "before.jsonl", before)
    mx.write_records(tmp_path / "after.jsonl", after)
    found = mx.compare(cli.load_records(tmp_path / "before.jsonl"), cli.load_records(tmp_path / "after.jsonl"))
    seen = {(r["run"], r["path"], r["mask"]): (r["min_ms"], round(r["noise"], 2)) for r in before + after}
    assert [(f["record"]["path"], f["record"]["mask"], f["what"]) for f in found.flagged] == \
        [("native", "window", "time")], f"{mx.format_regressions(found)}\n(fastest ms, noise): {seen}"
    assert found.untimed == "" and found.loads[1] is not None
    print(mx.format_regressions(found))


def test_the_cli_writes_the_records_and_exits_1_on_a_regression(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mx, "buckets", lambda quick: [mx.Bucket("chat", "decode", 2, 1, 1, 16, 8, "float32", "none")])
    out = tmp_path / "m.jsonl"
    assert cli.main(["--matrix", "--quick", "--quiet", "--rounds", "2", "--out", str(out)]) == 0
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in first] == list(mx.PATHS)
    old = _rerun(first, "old", lambda r: r["times_ms"])   # committed on a quiet machine
    fast = tmp_path / "fast.jsonl"   # a committed run in which every path was 100x faster: the machine drifted
    fast.write_text("".join(json.dumps({**r, "min_ms": r["min_ms"] / 100,
                                        "median_ms": r["median_ms"] / 100, "noise": 0.0}) + "\n" for r in old))
    # the later runs repeat the first one's times, so that only the committed records differ
    monkeypatch.setattr(mx, "run", lambda *a, **k: _rerun(first, "again", lambda r: r["times_ms"]))
    capsys.readouterr()
    assert cli.main(["--matrix", "--quiet", "--rounds", "2", "--out", str(out), "--compare", str(fast)]) == 0
    said = capsys.readouterr().out
    assert "every path is slower alike" in said and "REGRESSION" not in said
    native = tmp_path / "native.jsonl"   # one in which the native path alone was 100x faster
    native.write_text("".join(json.dumps({**r, "noise": 0.0, **(
        {"min_ms": r["min_ms"] / 100, "median_ms": r["median_ms"] / 100} if r["path"] == "native" else {})}) + "\n"
        for r in old))
    assert cli.main(["--matrix", "--quiet", "--rounds", "2", "--out", str(out), "--compare", str(native)]) == 1
    said = capsys.readouterr().out
    assert "REGRESSION chat decode" in said and said.count("REGRESSION") == 1
    assert max(len(line) for line in said.split("GPU records")[1].splitlines()) <= 110   # the tables and the verdict


def test_the_gpu_records_are_shown_in_the_matrixs_terms_where_they_exist():
    table = mx.gpu_report(cli.load_records(cli.DEFAULT_OUT))
    lines = table.splitlines()
    assert lines[0].startswith("GPU records: run") and "H200" in lines[0]
    native = [line for line in lines[1:] if " native " in line]
    assert any("32768" in line and "float32" in line and " ms" in line for line in native)
    assert all("not applicable" in line for line in native if "float16" in line)   # chapter 10's kernel is fp32 only
    assert not any("not applicable" in line for line in lines[1:] if " public " in line)
