"""The hardware presets and their sources, this machine measured, and the roofline drawn (chapter 02)."""
import math

import matplotlib
import pytest

from course_lib.core import hardware
from course_lib.core.hardware import DATASHEET, ILLUSTRATIVE, MEASURED, Figure
from course_lib.models import measure
from course_lib.views import roofline_plot

matplotlib.use("Agg")
REQUIRED = ("h100_sxm", "h200", "a100_80gb", "rtx_4090", "l4", "laptop_cpu", "edge_npu", "riscv_manycore")
TERA, GIGA, KiB = 1e12, 1e9, 1024


def test_the_presets_the_course_promises_are_all_there():
    assert set(REQUIRED) <= set(hardware.HARDWARE)


@pytest.mark.parametrize("key", REQUIRED)
def test_every_figure_of_a_preset_carries_a_source_and_a_kind(key):
    hw = hardware.HARDWARE[key]
    figures = hw.figures()
    for name in ("bandwidth", "sram_per_unit", "units"):
        assert name in figures
    assert any(name.startswith("flops:") for name in figures)
    for name, fig in figures.items():
        assert isinstance(fig, Figure), name
        assert fig.source.strip(), f"{key} {name} has no source"
        assert fig.kind in hardware.KINDS
        assert (fig.value > 0 or name == "l2") and math.isfinite(fig.value)  # l2 0: no cache at all


@pytest.mark.parametrize("key, l2_mib, tf32", [
    ("h100_sxm", 50, 494.7), ("h200", 50, 494.7), ("a100_80gb", 40, 156), ("rtx_4090", 72, 82.6), ("l4", 48, 60),
])
def test_every_gpu_preset_has_l2_and_dense_tf32_with_sources(key, l2_mib, tf32):
    hw = hardware.HARDWARE[key]
    assert float(hw.l2) == l2_mib * 1024 ** 2 and "L2" in hw.l2.source and hw.l2.kind == DATASHEET
    assert hw.peak("tf32") == pytest.approx(tf32 * TERA) and "TF32" in hw.peak_flops["tfloat32"].source
    assert hw.peak("tfloat32") >= hw.peak("float32")  # the RTX 4090 is the one whose TF32 only matches FP32
    assert hw.rate_dtype("float32") == "float32"  # float32 math stays off the tensor cores unless asked


@pytest.mark.parametrize("key", ["laptop_cpu", "edge_npu", "riscv_manycore"])
def test_illustrative_presets_say_no_tf32_and_their_middle_level(key):
    hw = hardware.HARDWARE[key]
    assert hw.l2 is not None and hw.l2.kind == ILLUSTRATIVE
    assert hw.peak("tfloat32") == hw.peak("float32") and "no TF32" in hw.peak_flops["tfloat32"].source


@pytest.mark.parametrize("key, dtype, flops, bandwidth, smem_kib, sms", [
    ("h100_sxm", "bfloat16", 989.5, 3.35, 228, 132),
    ("h100_sxm", "float32", 67, 3.35, 228, 132),
    ("h200", "float16", 989.5, 4.8, 228, 132),
    ("a100_80gb", "bfloat16", 312, 2.039, 164, 108),
    ("a100_80gb", "float32", 19.5, 2.039, 164, 108),
    ("rtx_4090", "float16", 165.2, 1.008, 100, 128),
    ("rtx_4090", "float32", 82.6, 1.008, 100, 128),
    ("l4", "float16", 121, 0.3, 100, 58),
    ("l4", "float32", 30.3, 0.3, 100, 58),
])
def test_gpu_datasheet_figures_are_the_dense_vendor_numbers(key, dtype, flops, bandwidth, smem_kib, sms):
    hw = hardware.HARDWARE[key]
    assert hw.peak(dtype) == pytest.approx(flops * TERA)
    assert hw.memory_bandwidth() == pytest.approx(bandwidth * TERA)
    assert float(hw.sram_per_unit) == smem_kib * KiB
    assert float(hw.units) == sms
    assert hw.peak_flops[dtype].kind == DATASHEET and hw.bandwidth.kind == DATASHEET


def test_h200_measured_figures_are_kept_apart_from_its_datasheet():
    hw = hardware.HARDWARE["h200"]
    bw, sgemm = hw.measured["bandwidth"], hw.measured["flops:float32"]
    assert bw.kind == sgemm.kind == MEASURED and bw.date == sgemm.date  # values: tests/test_gpu_peaks_record.py
    assert all(f.kind != MEASURED for f in hw.peak_flops.values())  # datasheet table untouched
    assert hw.memory_bandwidth() == 4.8e12 and hw.memory_bandwidth("measured") == bw.value
    assert hw.peak("float32") == pytest.approx(67e12) and hw.peak("float32", "measured") == sgemm.value
    assert hw.ridge("float32", "measured") == pytest.approx(sgemm.value / bw.value)


@pytest.mark.parametrize("key", ["laptop_cpu", "edge_npu", "riscv_manycore"])
def test_class_typical_presets_say_they_are_illustrative(key):
    for name, fig in hardware.HARDWARE[key].figures().items():
        assert fig.kind == ILLUSTRATIVE, name
        assert "not a product datasheet" in fig.source


def test_edge_npu_has_hundreds_of_kib_riscv_shares_per_cluster():
    npu, rv = hardware.HARDWARE["edge_npu"], hardware.HARDWARE["riscv_manycore"]
    assert 128 * KiB <= float(npu.sram_per_unit) <= 1024 * KiB
    assert "DMA" in npu.sram_per_unit.source
    assert rv.unit_name == "cluster" and "shared" in rv.sram_per_unit.source


def test_a_measured_figure_needs_a_date_and_a_known_kind():
    with pytest.raises(ValueError, match="date"):
        Figure(1.0, "B/s", "somewhere", MEASURED)
    with pytest.raises(ValueError, match="kind"):
        Figure(1.0, "B/s", "somewhere", "rumour")


def test_ridge_is_peak_over_bandwidth_attainable_the_lower_roof():
    hw = hardware.HARDWARE["a100_80gb"]
    assert hw.ridge("float16") == pytest.approx(312e12 / 2.039e12)
    assert hw.attainable(10, "float16") == pytest.approx(10 * 2.039e12)  # memory roof
    assert hw.attainable(1000, "float16") == pytest.approx(312e12)  # compute roof
    assert hw.attainable(hw.ridge("float16"), "float16") == pytest.approx(312e12)


def test_a_dtype_without_its_own_peak_borrows_the_one_it_runs_at():
    assert hardware.HARDWARE["a100_80gb"].rate_dtype("float8_e4m3fn") == "float16"  # converted on load
    assert hardware.HARDWARE["h100_sxm"].rate_dtype("fp8") == "float8_e4m3fn"
    assert hardware.HARDWARE["edge_npu"].rate_dtype("float64") == "float32"
    with pytest.raises(ValueError, match="no peak"):
        hardware.HARDWARE["rtx_4090"].peak("float64")


def test_hardware_lookup_by_key_or_name_else_a_clear_error():
    assert hardware.hardware("l4") is hardware.hardware("NVIDIA L4")
    with pytest.raises(ValueError, match="presets"):
        hardware.hardware("tpu")


def test_preset_table_lists_every_preset_with_its_kind():
    text = hardware.format_table(hardware.preset_table("float16"))
    for hw in hardware.HARDWARE.values():
        assert hw.name in text
    assert "datasheet" in text and "illustrative" in text
    h100 = next(r for r in hardware.preset_table("float16") if r["key"] == "h100_sxm")
    assert (h100["l2_mib"], h100["tf32_tflops"]) == (50, pytest.approx(494.7))
    assert "L2" in text and "MiB" in text and "TF32" in text and "peaks in float16" in text
    assert max(len(line) for line in text.splitlines()) <= 110     # JupyterLab's width


def fake_measurement(**changes):
    values = dict(bandwidth=10e9, flops={"float32": 50e9, "float64": 25e9}, exp_per_s=1e9, cpu="test cpu",
                  threads=2, date="2026-01-01", sram_per_core=2 * 1024 * 1024)
    values.update(changes)
    return measure.Measurement(**values)


def test_measure_this_machine_gives_plausible_finite_figures():
    m = measure.measure_this_machine(copy_mib=8, matmul_n=128, exp_n=1 << 16, repeats=1)
    for value in [m.bandwidth, m.exp_per_s, *m.flops.values()]:
        assert value > 0 and math.isfinite(value)
    assert set(m.flops) == {"float32", "float64"}
    assert 1e6 < m.bandwidth < 1e14  # between a floppy and a stack of HBM
    assert m.threads >= 1 and m.date
    assert m.summary().startswith(m.cpu)
    assert set(m.runs) == {"copy", "matmul float32", "matmul float64", "exp"} and min(m.runs.values()) >= 1
    assert "timed runs: copy" in m.summary()


def test_a_timing_repeats_until_its_fastest_runs_agree(monkeypatch):
    """A noisy first few runs (a busy neighbour) are timed again until the fastest three agree."""
    clock = iter([0, 10,  10, 11,  11, 15,  15, 16,  16, 17,  17, 18] + list(range(100, 200)))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    best, runs = measure.best_time(lambda: None, 3)
    assert (best, runs) == (1, 5)  # durations 10, 1, 4, 1, 1: stable once three runs of 1 are in


def test_a_timing_that_never_settles_stops_and_says_so(monkeypatch):
    durations = iter(range(1, 100))  # every run slower than the last: the fastest three never agree
    state = {"t": 0.0, "start": True}

    def clock():
        if not state["start"]:
            state["t"] += next(durations)
        state["start"] = not state["start"]
        return state["t"]

    monkeypatch.setattr(measure.time, "perf_counter", clock)
    best, runs = measure.best_time(lambda: None, 3, max_runs=12)
    assert runs == 12 and best == 1
    m = fake_measurement(runs={"copy": measure.MAX_RUNS, "exp": 3})
    assert "never settled" in m.summary()


def test_this_machine_as_hardware_has_only_measured_figures():
    hw = fake_measurement().as_hardware()
    assert all(fig.kind == MEASURED for fig in hw.figures().values())
    assert hw.ridge("float32") == pytest.approx(5.0)
    assert float(hw.sram_per_unit) == 2 * 1024 * 1024


def test_plot_roofline_draws_a_roof_per_machine_and_each_point():
    fig = roofline_plot.plot_roofline(["h100_sxm", "l4", fake_measurement()],
                                 points=[dict(intensity=30, flops=1e12, label="a"),
                                         dict(intensity=300, flops=2e12, label="b")])
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert sum("[" in lab for lab in labels) == 3  # three roofs, each labelled with dtype and kind
    assert "a" in labels and "b" in labels
    assert any("measured" in lab for lab in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    matplotlib.pyplot.close(fig)


def test_settled_says_how_many_runs_and_whether_they_agreed():
    assert measure.settled(5) == "5 runs, until the 3 fastest agreed within 5%"
    assert "never settled" in measure.settled(measure.MAX_RUNS)


# -- occupancy: the one model of how many blocks an SM holds ------------------------------

def calculator(regs, shared, threads):
    """The CUDA occupancy calculator's rule for Hopper, written out with the datasheet's numbers
    (64 Ki registers allocated per warp in units of 256, 228 KiB shared with 1 KiB reserved per
    block, 64 warps, 32 blocks per SM): the oracle the preset and the one occupancy are held to."""
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by = {"warps": 64 // warps, "registers": 65536 // (per_warp * warps),
          "shared": 233472 // (shared + 1024) if shared else 32, "blocks": 32}
    blocks = min(by.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "occupancy": blocks * warps / 64,
            "limited_by": min(by, key=by.get)}


@pytest.mark.parametrize("threads", [32, 64, 96, 128, 256, 384, 512, 1024])
def test_the_records_occupancy_is_the_calculators_on_the_h200(threads):
    for regs in [*range(1, 256, 7), 32, 40, 64, 128, 168, 255]:
        for shared in (0, 1, 1024, 12288, 16384, 49152, 65536, 100 * KiB, 116 * KiB, 200 * KiB, 227 * KiB):
            got = hardware.occupancy("h200", regs, shared, threads).as_record()
            assert got == calculator(regs, shared, threads), (regs, shared, threads)


def test_occupancy_reads_every_limit_from_the_preset():
    h200 = hardware.HARDWARE["h200"]
    assert (h200.register_allocation_unit, h200.smem_reserved_per_block) == (256, KiB)
    assert (int(float(h200.units)), int(float(h200.max_smem_per_block)), h200.static_smem_per_block,
            h200.max_threads_per_block) == (132, 227 * KiB, 48 * KiB, 1024)  # what the CUDA steps assume
    occ = hardware.occupancy(h200, 41, 48 * KiB, 128)  # 41 registers: 1,312 per warp, rounded up to 1,536
    assert occ.limits == {"shared memory": 228 // 49, "registers": 65536 // (1536 * 4), "threads": 16, "blocks": 32}
    assert (occ.blocks, occ.warps, occ.limiter) == (4, 16, "shared memory") and occ.fraction == 0.25
    ada = hardware.occupancy("rtx_4090", 32, 1024, 256)  # 1,536 threads per SM on sm_89
    assert ada.limits["threads"] == 6 and ada.limits["blocks"] == 24


def test_occupancy_gives_no_block_over_a_per_block_limit():
    big = hardware.occupancy("h100_sxm", 32, 228 * KiB, 128)
    assert big.blocks == 0 and big.over_block == ("shared memory",) and big.limiter == "shared memory"
    spills = hardware.occupancy("h100_sxm", 256, 1024, 128)
    assert spills.blocks == 0 and spills.over_block == ("registers",)
    with pytest.raises(ValueError, match="GPU figure"):
        hardware.occupancy("laptop_cpu", 32, 1024, 128)


def test_a_device_name_finds_its_preset_and_a_cpu_finds_none():
    assert hardware.preset_for("NVIDIA H200") == "h200" and hardware.preset_for("NVIDIA A100-SXM4-80GB") == "a100_80gb"
    assert hardware.preset_for("AMD EPYC 9654") is None and hardware.preset_for(None) is None


def test_sram_rounds_registers_by_the_presets_allocation_unit():
    from course_lib.models import sram
    gpus = [hw for hw in hardware.HARDWARE.values() if hw.registers_per_unit is not None]
    assert gpus and all(hw.register_allocation_unit == 32 * sram.REGISTER_GRANULE for hw in gpus)
