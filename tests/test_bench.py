"""course_lib.bench: timing helpers and the regression records every benchmark writes.

The records are a contract (shared/DESIGN.md, "Measuring"): each one carries the
shape, dtype, mask, impl, block sizes, the median time, the derived TFLOP/s and
bytes moved, and where it was measured; a record whose time leaves the kernel's work
out (the launch layer) carries no FLOP rate."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from course_lib import bench
from course_lib.bench import cli as benchrun
from course_lib.bench import timing
from course_lib.core.flops import attention_flops
from course_lib.kernels import cuda_steps as cs
from course_lib.kernels import tensor_cores

RECORDS = Path(__file__).resolve().parent.parent / "notebooks" / "records"

ENV = {"cpu": "test cpu", "python": "3.x"}  # skip probing the machine in most tests


def test_time_it_warms_up_then_returns_the_median_of_the_repeats(monkeypatch):
    calls = []
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # runs of 1 s, 3 s, 2 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    assert bench.time_it(lambda x: calls.append(x), "a", repeats=3, warmup=2) == 2.0
    assert calls == ["a"] * 5


def test_time_it_passes_keywords_and_refuses_zero_repeats():
    seen = {}
    bench.time_it(lambda *, n: seen.update(n=n), n=3, repeats=1, warmup=0)
    assert seen == {"n": 3}
    with pytest.raises(ValueError, match="repeats"):
        bench.time_it(print, repeats=0)


def test_time_interleaved_runs_the_contestants_in_turn():
    order = []
    times = bench.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                   repeats=3, warmup=1)
    assert order == ["a", "b"] * 4 and set(times) == {"a", "b"}


def test_environment_names_the_machine_the_versions_and_the_date():
    env = bench.environment()
    for key in ("cpu", "python", "numpy", "numba", "numba-cuda", "course_lib", "gpu", "date"):
        assert key in env and env[key], key
    json.dumps(env)  # must be storable as JSON


def test_environment_names_the_cpus_microarchitecture_where_linux_says():
    cpu = bench.environment()["cpu_identity"]
    if not Path("/proc/cpuinfo").exists():
        assert cpu == {}
        return
    assert {"vendor", "family", "model", "stepping", "microarchitecture", "simd"} <= set(cpu)
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    assert ("avx2" in cpu["simd"]) == (" avx2" in flags)
    assert ("avx512f" in cpu["simd"]) == (" avx512f" in flags)


@pytest.mark.parametrize("vendor, family, model, name", [
    ("AuthenticAMD", 25, 0x11, "Zen 4"), ("AuthenticAMD", 25, 0x61, "Zen 4"), ("AuthenticAMD", 25, 0x01, "Zen 3"),
    ("AuthenticAMD", 25, 0x21, "Zen 3"), ("AuthenticAMD", 23, 0x31, "Zen 2"), ("AuthenticAMD", 26, 0x02, "Zen 5"),
    ("GenuineIntel", 6, 0x8F, "Sapphire Rapids"), ("GenuineIntel", 6, 0x55, "Skylake-SP / Cascade Lake / Cooper Lake"),
    ("GenuineIntel", 6, 0x01, None), ("HygonGenuine", 24, 0x00, None)])
def test_microarchitecture_by_family_and_model(vendor, family, model, name):
    from course_lib.core import machine
    assert machine.microarchitecture(vendor, family, model) == name


@pytest.mark.parametrize("line, kind", [
    ("\tvfmadd213ps\t(%rbx), %zmm4, %zmm0", "zmm packed memory"),
    ("\tvfmadd231ps\t%zmm18, %zmm22, %zmm9", "zmm packed register"),
    ("\tvfmadd231ps\t%ymm1, %ymm2, %ymm3", "ymm packed register"),
    ("\tvfnmadd231ps\t%xmm1, %xmm2, %xmm3", "xmm packed register"),
    ("\tvfmadd231ss\t%xmm0, %xmm4, %xmm5", "scalar register"),
    ("\tvfmadd213ss\t256(%rbx,%rdi,4), %xmm3, %xmm4", "scalar memory"),
    ("\tvmaxps\t%zmm8, %zmm4, %zmm3", None), ("\tvmulps\t%ymm1, %ymm2, %ymm3", None)])
def test_an_fma_is_counted_by_width_lanes_and_operand(line, kind):
    from course_lib.bench import simd
    assert simd.fma_kind(line) == kind
    assert simd.fma_table(f"{line}\n{line}\n\tret") == ({kind: 2} if kind else {})


def test_a_record_has_every_field_the_design_requires():
    rec = bench.record(benchmark="t", impl="flash_numpy", shape=(2, 4, 128, 256, 64), dtype=np.float32,
                       causal=False, block_q=64, block_k=32, time_s=0.5, env=ENV)
    for key in ("shape", "dtype", "mask", "impl", "block_q", "block_k", "time_s", "tflops",
                "bytes_moved", "environment", "run"):
        assert key in rec, key
    assert rec["shape"] == [2, 4, 128, 256, 64]
    assert (rec["dtype"], rec["mask"], rec["block_q"], rec["block_k"]) == ("float32", "none", 64, 32)
    assert rec["environment"] == ENV


def test_tflops_is_4_b_h_nq_nk_d_over_time():
    rec = bench.record(benchmark="t", impl="x", shape=(2, 3, 100, 300, 64), dtype="float32", time_s=0.25, env=ENV)
    assert rec["flops"] == 4 * 2 * 3 * 100 * 300 * 64
    assert rec["tflops"] == pytest.approx(4 * 2 * 3 * 100 * 300 * 64 / 0.25 / 1e12)


def test_causal_flops_are_about_half_and_decode_counts_every_key():
    full = bench.record(benchmark="t", impl="x", shape=(1, 2, 512, 512, 64), dtype="float16", time_s=1.0, env=ENV)
    causal = bench.record(benchmark="t", impl="x", shape=(1, 2, 512, 512, 64), dtype="float16", time_s=1.0,
                          causal=True, env=ENV)
    assert causal["flops"] == 4 * 2 * 64 * 512 * 513 // 2  # N (N + 1) / 2 pairs: about half, not exactly
    assert causal["tflops"] == pytest.approx(full["tflops"] / 2, rel=2e-3)
    assert causal["mask"] == "causal" and causal["causal"] is True
    decode = bench.record(benchmark="t", impl="x", shape=(1, 2, 1, 4096, 64), dtype="float16", time_s=1.0,
                          causal=True, env=ENV)
    assert decode["flops"] == 4 * 2 * 4096 * 64  # Nq = 1, bottom-right: the query sees every key
    window = bench.record(benchmark="t", impl="x", shape=(1, 1, 64, 64, 8), dtype="float32", time_s=1.0,
                          window_size=(3, 0), mask="window (3, 0)", env=ENV)
    assert window["flops"] == 4 * 8 * sum(min(i, 3) + 1 for i in range(64))


def test_bytes_moved_is_compulsory_traffic_or_the_kernels_count():
    rec = bench.record(benchmark="t", impl="x", shape=(1, 8, 10, 20, 16), heads_k=2, dtype="float16",
                       time_s=1.0, env=ENV)
    q_o = 1 * 8 * 10 * 16 * 2      # Q read, O written
    k_v = 1 * 2 * 20 * 16 * 2      # K and V read once per K/V head (GQA)
    lse = 1 * 8 * 10               # float32
    assert rec["bytes_moved"] == (q_o + k_v) * 2 + lse * 4 and rec["bytes_source"] == "compulsory"
    counted = bench.record(benchmark="t", impl="x", shape=(1, 8, 10, 20, 16), dtype="float16", time_s=1.0,
                           bytes_moved=12345, env=ENV)
    assert (counted["bytes_moved"], counted["bytes_source"]) == (12345, "counted")


def test_records_refuse_a_non_positive_time():
    with pytest.raises(ValueError, match="time_s"):
        bench.record(benchmark="t", impl="x", shape=(1, 1, 1, 1, 1), dtype="float32", time_s=0.0, env=ENV)


def test_a_launch_record_carries_the_work_but_no_flop_rate():
    launch = bench.record(benchmark="t", impl="x", shape=(4, 16, 64, 64, 64), dtype="float32", time_s=8e-5,
                          layer="launch", env=ENV)
    assert "tflops" not in launch and launch["flops"] == 4 * 4 * 16 * 64 * 64 * 64
    for layer in ("kernel", "end to end"):  # their time includes the work: a rate (end to end: a lower bound)
        rec = bench.record(benchmark="t", impl="x", shape=(1, 1, 8, 8, 8), dtype="float32", time_s=1.0,
                           layer=layer, env=ENV)
        assert rec["tflops"] == pytest.approx(rec["flops"] / 1e12)


def test_a_record_refuses_an_unknown_layer_and_a_given_flop_rate():
    with pytest.raises(ValueError, match="layer must be one of"):
        bench.record(benchmark="t", impl="x", shape=(1, 1, 1, 1, 1), dtype="float32", time_s=1.0,
                     layer="host", env=ENV)
    with pytest.raises(ValueError, match="tflops is derived"):
        bench.record(benchmark="t", impl="x", shape=(1, 1, 1, 1, 1), dtype="float32", time_s=1.0,
                     layer="launch", tflops=2123.0, env=ENV)


@pytest.mark.parametrize("path", sorted(RECORDS.glob("*.jsonl")), ids=lambda p: p.name)
def test_no_committed_launch_record_claims_a_flop_rate(path):
    launch = [r for r in bench.load_records(path) if r.get("layer") == "launch"]
    assert not [r for r in launch if r.get("tflops") is not None], f"{path.name}: launch records with TFLOP/s"
    from course_lib.tools import evaluate
    layers = evaluate.LAYERS if path.name == "model_eval.jsonl" else bench.LAYERS   # chapter 13's model
    assert all(r.get("layer") in (None, *layers) for r in bench.load_records(path))


def test_append_then_load_round_trips_and_filters(tmp_path):
    path = tmp_path / "records" / "r.jsonl"  # the folder is created on first use
    written = [bench.append_record(path, benchmark="t", impl="flash_numpy", shape=(1, 2, n, n, 8),
                                   dtype="float32", causal=causal, time_s=0.1 * n, run="r1", env=ENV,
                                   tiles_computed=n)
               for n in (16, 32) for causal in (False, True)]
    assert bench.load_records(path) == written
    assert [r["shape"][2] for r in bench.load_records(path, causal=True)] == [16, 32]
    assert bench.load_records(path, causal=True, tiles_computed=32)[0]["time_s"] == pytest.approx(3.2)
    assert len(path.read_text().splitlines()) == 4  # one JSON object per line


def test_latest_run_keeps_only_the_last_runs_records(tmp_path):
    path = tmp_path / "r.jsonl"
    for run in ("old", "old", "new", "new"):
        bench.append_record(path, benchmark="t", impl="x", shape=(1, 1, 4, 4, 4), dtype="float32",
                            time_s=1.0, run=run, env=ENV)
    assert [r["run"] for r in bench.latest_run(bench.load_records(path))] == ["new", "new"]
    assert bench.latest_run([]) == []


def test_the_committed_causal_skipping_records_are_complete():
    path = RECORDS / "causal_skipping.jsonl"
    records = bench.latest_run(bench.load_records(path))
    assert {r["causal"] for r in records} == {False, True}
    for r in records:
        B, H, Nq, Nk, D = r["shape"]
        assert Nq == Nk and r["impl"] == "flash_numpy"
        assert r["tflops"] == pytest.approx(attention_flops(B, H, Nq, Nk, D, causal=r["causal"])
                                            / r["time_s"] / 1e12)
        assert {"cpu", "numpy", "numba", "date"} <= set(r["environment"])


def test_the_cpu_bench_run_has_every_bucket_impl_and_peer():
    from course_lib.bench import cli as benchrun

    path = RECORDS / "bench_cpu.jsonl"
    records = bench.load_records(path, benchmark="bench")
    assert len({r["run_id"] for r in records}) == 1
    impls = {r["impl"] for r in records}
    assert set(benchrun.CPU_IMPLS) <= impls and "torch_naive" in impls
    shapes = {(r["bucket"], r["Nq"], r["Nk"], r["D"], r["causal"], r["dtype"]) for r in records}
    assert {s[0] for s in shapes} == {"prefill", "decode"} and {s[5] for s in shapes} == {"float32", "float16"}
    assert len(records) == len(shapes) * len(impls)      # every impl in every bucket: a time or its reason
    for r in records:
        assert r["layer"] == "end to end" and r["device"] == r["environment"]["cpu"]
        assert (r["median_ms"] is None) == ("skipped" in r), r


# -- the bench CLI and the CUDA steps' records -----------------------------------------------

def test_a_record_carries_the_flat_fields_and_its_layer():
    rec = bench.record(benchmark="t", impl="x", shape=(2, 3, 5, 7, 4), dtype="float32", time_s=0.002,
                       layer="kernel", device="NVIDIA H200", env={"cpu": "c"}, run="r1")
    for key in ("run_id", "impl", "device", "dtype", "B", "H", "Nq", "Nk", "D", "causal", "median_ms", "tflops",
                "layer", "environment"):
        assert key in rec
    assert (rec["B"], rec["Nk"], rec["median_ms"], rec["device"]) == (2, 7, 2.0, "NVIDIA H200")


def test_the_bench_cli_runs_the_cpu_impls_and_reports_ratios(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert benchrun.main(["--out", str(out), "--sizes", "32", "--head-dims", "8", "--dtypes", "float32",
                          "--decode-nk", "64", "--cpu-tokens", "32", "--repeats", "1", "--quiet", "--cpu",
                          "--impls", "naive", "flash_numpy"]) == 0
    records = bench.load_records(out)
    assert {r["impl"] for r in records} == {"naive", "flash_numpy"}
    assert {r["bucket"] for r in records} == {"prefill", "decode"}
    assert all(r["layer"] == "end to end" and r["median_ms"] > 0 and r["run_id"] == records[0]["run_id"]
               for r in records)
    table = capsys.readouterr().out
    assert "ratio" in table and "flash_numpy" in table


def _bench_rec(impl, ms, dtype="float32", device="AMD EPYC"):
    return bench.record(benchmark="bench", impl=impl, shape=(1, 2, 64, 64, 8), dtype=dtype, time_s=ms / 1e3,
                        run="r1", env={"cpu": device}, layer="end to end", device=device, bucket="prefill")


def test_the_report_takes_torch_naive_as_baseline_else_naive():
    # naive ran first in the run (as the CLI orders the impls); torch_naive is still the baseline
    with_torch = [_bench_rec("naive", 40.0), _bench_rec("flash_numpy", 20.0), _bench_rec("torch_naive", 10.0)]
    table = benchrun.report(with_torch)
    assert "flash_numpy                20.000     0.00   0.50" in table
    assert "naive                      40.000     0.00   0.25" in table
    without = benchrun.report(with_torch[:2])
    assert "flash_numpy                20.000     0.00   2.00" in without


def test_the_roofline_plot_draws_only_the_records_own_machine():
    import matplotlib
    matplotlib.use("Agg")
    assert benchrun.preset_for("NVIDIA H200") == "h200" and benchrun.preset_for("AMD EPYC") is None
    cpu = benchrun.plot_roofline([_bench_rec("naive", 40.0)])
    assert not cpu.lines and "no datasheet roofline" in cpu.get_title()
    gpu = benchrun.plot_roofline([_bench_rec("torch_naive", 1.0, device="NVIDIA H200")])
    assert any("H200" in line.get_label() for line in gpu.lines)


def test_a_bucket_an_impl_cannot_take_is_recorded_with_why():
    b = dict(kind="prefill", B=1, H=1, Nq=8, Nk=8, D=8, causal=False, dtype="float16")
    with pytest.raises(benchrun.NotApplicable, match="float32 only"):
        benchrun.callable_for("cuda_tuned", b, (None, None, None), on_gpu=False)
    rec = benchrun.skipped("cuda_tuned", b, "r", {}, "cpu", "kernel", "not applicable: float32 only")
    assert rec["median_ms"] is None and rec["skipped"].startswith("not applicable")


def _bucket(**change):
    """A small bucket, prefill float32 unless told; ``benchrun.make_inputs`` gives its host arrays."""
    return {**dict(kind="prefill", B=1, H=2, Nq=64, Nk=64, D=16, causal=False, dtype="float32"), **change}


def _inputs(b):
    return benchrun.make_inputs(b, np.random.default_rng(0), on_gpu=False)


def test_the_tensor_core_steps_are_timed_on_a_gpu_only():
    on_gpu = benchrun.impls_here(on_gpu=True, torch_here=True)
    assert {"cuda_tuned", "cuda_mma_f16", "cuda_mma_3xtf32", *benchrun.TORCH_PEERS} <= set(on_gpu)
    for torch_here in (False, True):
        here = benchrun.impls_here(on_gpu=False, torch_here=torch_here)
        assert "flash_numpy" in here and not [i for i in here if i.startswith("cuda_")]
        assert ("torch_naive" in here) == torch_here


@pytest.mark.parametrize("impl, dtype, why", [("cuda_mma_f16", "float32", "takes float16 or bfloat16"),
                                              ("cuda_mma_3xtf32", "float16", "computes float32 inputs")])
def test_a_tensor_core_step_refuses_a_dtype_it_does_not_take(monkeypatch, impl, dtype, why):
    monkeypatch.setattr(tensor_cores, "available", lambda: True)   # the dtype decides, on a GPU too
    b = _bucket(dtype=dtype)
    with pytest.raises(benchrun.NotApplicable, match=why):
        benchrun.callable_for(impl, b, _inputs(b), on_gpu=True)


def test_a_tensor_core_step_without_a_gpu_says_it_is_not_available(monkeypatch):
    monkeypatch.setattr(tensor_cores, "available", lambda: False)
    b = _bucket(dtype="float16")
    with pytest.raises(benchrun.NotApplicable, match="mma_f16 is not available here"):
        benchrun.mma_call("mma_f16", b, _inputs(b))


def test_a_decode_bucket_takes_decode_splits_choice_and_a_prefill_one_no_split(monkeypatch):
    launched = []

    def launcher(step, q, k, v, opts, mask, *, tiling=None, splits=1):
        launched.append((step, q.dtype.name, splits))
        return (lambda: "launched"), None, None
    monkeypatch.setattr(tensor_cores, "available", lambda: True)
    monkeypatch.setattr(tensor_cores, "launcher", launcher)
    for step, dtype in (("mma_f16", "float16"), ("mma_3xtf32", "float32")):
        decode = _bucket(kind="decode", B=2, H=4, Nq=1, Nk=4096, D=64, dtype=dtype)
        prefill = _bucket(Nq=1024, Nk=1024, D=64, dtype=dtype)
        chosen = tensor_cores.decode_splits(step, dtype, 2, 4, 1, 4096, 64, 64)[0]
        assert chosen > 1 and tensor_cores.decode_splits(step, dtype, 1, 2, 1024, 1024, 64, 64)[0] > 1
        for b in (decode, prefill):     # the rule would split both: only decode may
            assert benchrun.mma_call(step, b, _inputs(b))() == "launched"
        assert launched[-2:] == [(step, dtype, chosen), (step, dtype, 1)]


def test_every_record_says_what_its_impl_ran_on(tmp_path, monkeypatch):
    for impl in benchrun.impls_here(on_gpu=True, torch_here=True):
        for dtype in ("float32", "float16"):
            assert benchrun.runs_on(impl, dtype, on_gpu=True), (impl, dtype)
    assert benchrun.runs_on("cuda_mma_f16", "float16", True) == "mma.sync m16n8k16, fp32 accumulation"
    assert benchrun.runs_on("cuda_mma_3xtf32", "float32", True) == "mma.sync m16n8k8 tf32, 3 products"
    assert benchrun.runs_on("torch_sdpa_efficient", "float32", True) == "CUTLASS, 3xTF32 tensor cores"
    assert "SIMT" in benchrun.runs_on("torch_naive", "float32", True)
    assert benchrun.runs_on("torch_naive", "float32", False) == "CPU"
    # a run here, where the tensor-core steps are refused (a dtype) or not available (no GPU): still records
    monkeypatch.setattr(benchrun, "impls_here", lambda on_gpu, torch_here: ["flash_numpy", *benchrun.MMA_STEPS])
    monkeypatch.setattr(tensor_cores, "available", lambda: False)
    out = tmp_path / "b.jsonl"
    benchrun.main(["--out", str(out), "--sizes", "32", "--head-dims", "16", "--no-decode", "--cpu-tokens", "32",
                   "--repeats", "1", "--quiet", "--cpu", "--dtypes", "float32", "float16"])
    records = {(r["impl"], r["dtype"], r["causal"]): r for r in bench.load_records(out)}
    assert len(records) == 3 * 2 * 2 and all(r["runs_on"] == benchrun.RUNS_ON[r["impl"]] for r in records.values())
    assert records["flash_numpy", "float16", True]["median_ms"] > 0
    skipped = {(impl, dt): records[impl, dt, False]["skipped"] for impl, dt, _ in records if impl != "flash_numpy"}
    assert skipped["cuda_mma_f16", "float32"].startswith("not applicable: mma_f16 takes float16 or bfloat16")
    assert skipped["cuda_mma_3xtf32", "float16"].startswith("not applicable: mma_3xtf32 computes float32")
    assert "not available here" in skipped["cuda_mma_f16", "float16"]
    assert "not available here" in skipped["cuda_mma_3xtf32", "float32"]


def test_both_cuda_calls_take_their_options_from_validated(monkeypatch):
    seen = []

    class Seen(Exception):
        pass

    def validated(arrays, causal):
        seen.append(([x.shape for x in arrays], causal))
        raise Seen
    monkeypatch.setattr(benchrun, "validated", validated)
    monkeypatch.setattr(tensor_cores, "available", lambda: True)
    b = _bucket(causal=True)
    for call in (lambda: benchrun.cuda_call(b, _inputs(b)), lambda: benchrun.mma_call("mma_3xtf32", b, _inputs(b))):
        with pytest.raises(Seen):
            call()
    assert seen == [([(1, 2, 64, 16)] * 3, True)] * 2


def test_validated_gives_call_forwards_options_and_checks():
    b = _bucket(causal=True, Nq=8, Nk=32)
    opts, mask = benchrun.validated(_inputs(b), causal=True)
    assert opts.causal and opts.softmax_scale == pytest.approx(16 ** -0.5) and mask is not None
    q, k, v = _inputs(b)
    with pytest.raises(TypeError, match="one dtype"):
        benchrun.validated((q, k, v.astype(np.float16)), causal=False)


def test_the_report_reads_the_same_with_or_without_runs_on():
    """runs_on is a field of the records, not a column: the committed tables (chapter 10's) read as before."""
    plain = [_bench_rec("naive", 40.0), _bench_rec("flash_numpy", 20.0), _bench_rec("torch_naive", 10.0)]
    plain.append(benchrun.skipped("cuda_mma_f16", _bucket(D=8), "r1", {}, "AMD EPYC", "end to end",
                                  "not applicable: mma_f16 takes float16 or bfloat16 inputs"))
    marked = [{**r, "runs_on": benchrun.runs_on(r["impl"], r["dtype"], on_gpu=False)} for r in plain]
    table = benchrun.report(marked)
    assert table == benchrun.report(plain) and "cuda_mma_f16" in table and "flash_numpy" in table
    labelled = benchrun.report(marked, runs_on=True)          # asked for, it is the last column of a timed row
    assert labelled.splitlines()[1].endswith("ratio  runs on")
    assert "flash_numpy                20.000     0.00   0.50  CPU" in labelled


def test_h200_records_hold_every_step_and_peer_in_one_run():
    """Every step is timed beside its peers in one run: the chapter's run, or for the steps that
    split tiled_prefetch -> tiled_vec4 into one change each (added after it), the chain's run,
    which times the chain's two ends again beside naive torch and checks every step on the GPU."""
    spec = importlib.util.spec_from_file_location("gpu_steps", RECORDS.parent.parent / "benchmarks" / "gpu_steps.py")
    gpu_steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_steps)
    records = bench.load_records(RECORDS / "gpu_steps.jsonl", benchmark="gpu_steps")
    assert len({r["run_id"] for r in records}) == 1
    impls = {r["impl"] for r in records}
    chain = {f"cuda_{s}" for s in gpu_steps.CHAIN}
    assert {f"cuda_{s}" for s in cs.SIMT_STEPS} - impls <= chain
    assert set(benchrun.TORCH_PEERS) <= impls
    checked = bench.load_records(RECORDS / "gpu_steps.jsonl", benchmark="gpu_steps_check")
    assert checked and all(r["verdict"] == "PASS" for r in checked)
    timed = bench.load_records(RECORDS / "gpu_steps_chain.jsonl", benchmark="gpu_steps_chain")
    assert len({r["run_id"] for r in timed}) == 1
    assert chain | {"torch_naive"} <= {r["impl"] for r in timed}
    checked = bench.load_records(RECORDS / "gpu_steps_chain.jsonl", benchmark="gpu_steps_check")
    assert {r["step"] for r in checked} >= set(cs.SIMT_STEPS) and all(r["verdict"] == "PASS" for r in checked)
