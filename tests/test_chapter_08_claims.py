"""What chapter 08 says in prose, held to the records it reads and to the CPU that made them.

Each test reads a lecture cell's markdown (or a code cell's source or stored output) and fails when a
sentence states a number or an explanation that the record it describes contradicts.  CPU timings are
noisy on a shared machine, so no test pins a time: the prose quotes its record, and a test checks
that the quote is the record's (the same rounding), and that the record names its CPU.
"""
import re

from lectures import cell, markdown, output_of, quoted, records
from lectures import text as cell_text

ZEN4_FLOPS_PER_CYCLE = 32      # float32: two 256-bit FMA units, 8 lanes x 2 FLOPs each (AVX-512 runs in halves)
ZEN4_TOP_CLOCK_HZ = 5.7e9      # the fastest Zen 4 boost clock sold (Ryzen 9 7950X, EPYC 4584PX)


def latest(name, benchmark):
    rows = records(name, benchmark=benchmark)
    run = max(r["run"] for r in rows)
    return [r for r in rows if r["run"] == run]


def ch08(benchmark):
    return latest("cpu_ch08", f"ch08_{benchmark}")[0]


def micro(record):
    return record["environment"]["cpu_identity"]["microarchitecture"]


def source(cell_id):
    return "".join(cell("08", cell_id)["source"])


def test_every_ch08_record_names_its_cpu_microarchitecture():
    for benchmark in ("prange", "dot", "pages", "simd"):
        cpu = ch08(benchmark)["environment"]["cpu_identity"]
        assert cpu["microarchitecture"] and cpu["family"] and cpu["simd"], benchmark
    for r in latest("cpu_attention", "cpu_phases"):
        assert r["environment"]["cpu_identity"]["microarchitecture"], r["run"]


# ---- major 1: step 2's slowdown is the code prange made, not its threads --------------------------

def test_step_2_slowdown_is_said_to_be_the_parfor_code_measured_on_one_thread():
    text = cell_text("08", "l08-26")
    assert "waits for its slowest thread" not in text
    r = ch08("prange")
    t = r["min_s"]
    one = t["step 2, 1 thread"] / t["step 1"]
    assert one > 1.5                                                  # the record shows what the text explains
    assert f"({one:.1f}x step 1)" in text
    assert f"step 1 at {t['step 1']:.2f} s" in text and f"on one thread at {t['step 2, 1 thread']:.2f} s" in text
    flat = t["step 2's body, range, no prange"]
    assert f"took {flat:.2f} s" in text
    assert micro(r) in text and "parfor" in text
    assert "step 2 on 1 thread" in source("l08-25") and "set_num_threads(1)" in source("l08-25")


# ---- majors 2 and 3: the FMAs by width, the accumulator in memory, matmul_nt's registers ------------

def test_micro_4x16s_fmas_are_counted_by_width_and_the_memory_accumulator_named():
    text = cell_text("08", "l08-s05")
    fma = ch08("simd")["fma"]
    assert "few work on full 256-bit" not in text and "Numba gives us no way to pin" not in text
    (zmm_memory,) = quoted(r"became (\d+) FMAs on 512-bit `zmm` registers", text)
    assert int(zmm_memory) == fma["micro_4x16"]["zmm packed memory"] > 0
    assert "memory operand" in text and micro(ch08("simd")) in text
    assert "fma_table" in source("l08-s04") and "'ymm' in line" not in source("l08-s04")
    assert "register_widths" in source("l08-s14d")


def test_matmul_nt_is_said_to_keep_its_block_in_registers_as_its_machine_code_does():
    fma = ch08("simd")["fma"]["matmul_nt"]
    assert fma.get("zmm packed register", 0) > 0 and not any("memory" in kind for kind in fma)
    (registers,) = quoted(r"has (\d+) `zmm` FMAs register to register", cell_text("08", "l08-s05"))
    assert int(registers) == fma["zmm packed register"]
    assert "cannot keep its tile in registers" not in markdown("08")


# ---- majors 4 and 5: claims scoped to the CPU that made them; OpenBLAS's kernels as the output says ---

def test_the_room_left_by_the_other_blas_kernels_is_quoted_from_the_record_of_its_cpu():
    text = cell_text("08", "l08-s19c")
    run = latest("cpu_attention", "cpu_phases")
    def ratios(rows):
        values = [r["torch_s"] / r["kernel_s"] for r in rows]
        return f"{min(values):.2f}", f"{max(values):.2f}"
    chosen = [r for r in run if not r["openblas_coretype"]]
    other = [r for r in run if r["openblas_coretype"]]
    assert quoted(r"([\d.]+)-([\d.]+)x as fast as PyTorch's on one thread", text) == ratios(chosen)
    lo, hi = ratios(other)
    assert f"and {lo}-{hi}x with the {other[0]['blas_core']} ones" in text
    assert micro(run[0]) in text and run[0]["run"] in text
    # the old run's 1.6-1.9x is said as that run's, not this CPU's
    assert "1.6-1.9x as fast" not in text


def test_the_old_skylakex_figures_are_said_to_exceed_a_zen_4_core():
    text = cell_text("08", "l08-s19c")
    old = [r for r in records("cpu_attention", benchmark="cpu_phases", run="20261202T145212+0000")
           if r["blas_core"] == "SkylakeX"]
    rates = [r["flops"] / r["matmuls_s"] / 1e9 for r in old]
    lo, hi = quoted(r"matmuls at ([\d.]+)-([\d.]+) GFLOP/s on one thread", text)
    assert (lo, hi) == (f"{min(rates):.0f}", f"{max(rates):.0f}")
    assert min(rates) * 1e9 > ZEN4_FLOPS_PER_CYCLE * ZEN4_TOP_CLOCK_HZ     # what the text concludes from them
    ghz_lo, ghz_hi = quoted(r"take a clock of ([\d.]+)-([\d.]+) GHz", text)
    assert (ghz_lo, ghz_hi) == (f"{min(rates) / ZEN4_FLOPS_PER_CYCLE:.1f}", f"{max(rates) / ZEN4_FLOPS_PER_CYCLE:.1f}")


def test_openblas_kernels_named_in_prose_are_the_ones_the_output_shows():
    text = cell_text("08", "l08-s19c")
    assert "it sets `OPENBLAS_CORETYPE=Haswell`" not in text
    shown = re.search(r"this process's OpenBLAS runs: (\w+) kernels", output_of("08", "l08-s19b")).group(1)
    run = latest("cpu_attention", "cpu_phases")
    default = {r["blas_core"] for r in run if not r["openblas_coretype"]}
    (named,) = quoted(r"in this environment it picks its (\w+) kernels", text)
    assert {named} == default == {shown}
    # the roofline of the steps is the steps' own run, and the text says which kernels those ran
    assert 'r["run"] == steps_run[0]["run"]' in source("l08-s20")
    assert "this environment's setting, the phases record above" not in cell_text("08", "l08-s21")


# ---- major 6: naive attention pays for fresh pages --------------------------------------------

def test_naive_attentions_fresh_pages_are_quoted_from_the_record():
    text = cell_text("08", "l08-35")
    r = ch08("pages")
    t = r["min_s"]
    assert f"{t['np.exp into a fresh array']:.3f} s into a fresh array" in text
    assert f"{t['np.exp into a touched array']:.3f} s into one already touched" in text
    assert f"took {t['naive attention, fresh pages']:.2f} s" in text
    assert f"{t['naive attention, pages reused']:.2f} s with none" in text
    assert t["np.exp into a fresh array"] > t["np.exp into a touched array"]
    assert r["minor_faults"]["naive attention, pages reused"] < r["minor_faults"]["naive attention, fresh pages"]
    assert "runs its exponentials on one core" not in text


# ---- major 7: the phase breakdown times today's kernel -----------------------------------------

def test_section_6_breaks_down_todays_kernel_from_the_phases_record():
    code = source("l08-31")
    assert "flash_numba_cpu_microkernel" not in code and "matmul_nt" not in code and "phases_run" in code
    phase = next(r for r in latest("cpu_attention", "cpu_phases")
                 if r["shape"] == [1, 8, 4096, 4096, 64] and not r["openblas_coretype"])
    (share,) = quoted(r"on one thread, (\d+)% of it is the tile matmuls", cell_text("08", "l08-33"))
    assert share == f"{100 * phase['matmuls_s'] / phase['kernel_s']:.0f}"
    assert "copying $K_j$ and $V_j^\\top$ into the tile buffers" not in cell_text("08", "l08-33")
    assert "micro-kernel" not in source("l08-34")


# ---- major 8: the dot product as the record shows it ---------------------------------------------

def test_the_dot_product_comparison_is_the_records():
    text = cell_text("08", "l08-08")
    r = ch08("dot")
    t = {name: s * 1e3 for name, s in r["min_s"].items()}
    assert "by how much moves from run to run" not in text
    assert f"the loop took {t['njit loop']:.2f} ms" in text
    assert f"(below) {t['njit loop, FASTMATH']:.2f} ms" in text
    assert f"`np.dot` on one thread {t['np.dot, 1 thread']:.2f} ms" in text
    assert f"on {r['blas_threads']} threads {t['np.dot']:.2f} ms" in text
    assert micro(r) in text


# ---- minor: what the CPU does per instruction ----------------------------------------------------

def test_the_simd_width_is_this_cpus():
    text = cell_text("08", "l08-21")
    assert "This CPU can do 8 float32 multiply-adds in one instruction (AVX2)" not in text
    assert micro(ch08("simd")) in text and "16 in one instruction" in text



def test_the_row_pass_is_not_a_hundredth_and_a_gpu_tile_is_not_free():
    """The row pass's share of a tile's FLOPs is not a hundredth (4D = 256 matmul FLOPs a score at D = 64
    against a few tens), and a GPU kernel pays a loop step and a barrier per tile, not nothing."""
    words = " ".join(markdown("08").split())
    assert "a hundredth of the matmuls' FLOPs" not in words and "pays nothing per tile" not in words
    assert "$4D$ = 256 a score at $D = 64$" in words and "pays little per tile" in words


# ---- minors: figures quoted as their records and outputs give them ---------------------------------

def test_the_d128_tiles_are_quoted_as_their_share_of_the_l2():
    """At D = 128 a work item's S, K and V tiles are 1 MiB: 1.0x a 1 MiB L2, not twice it."""
    text = cell_text("08", "l08-s19c")
    r = next(r for r in latest("cpu_attention", "cpu_phases") if r["shape"][-1] == 128)
    (l2_kib,) = quoted(r"'L2': '(\d+) KiB'", output_of("08", "l08-s12"))
    Br, Bc = r["tiles"]
    D, l2 = r["shape"][-1], int(l2_kib) * 1024
    svk = 4 * (Br * Bc + 2 * Bc * D)
    with_q_o = svk + 4 * 2 * Br * D
    at_64 = 4 * (Br * Bc + 2 * Bc * 64 + 2 * Br * 64)
    assert "are twice this L2" not in text
    assert f"are {svk // 2**20} MiB, {svk / l2:.1f}x this L2" in text
    assert f"{with_q_o / l2:.2f}x with $Q_i$ and $O_i$" in text
    assert f"at $D = 64$ the same five are {at_64 // 1024} KiB, {at_64 / l2:.2f}x" in text


def test_the_tile_sweeps_times_are_set_beside_the_busy_steps_run_made_after_it():
    """The sweep's times are about 2x the steps record's: the text says so, and names the busy run beside it."""
    text = cell_text("08", "l08-s13")
    sweep = latest("cpu_attention", "cpu_tiles")
    busy = {r["impl"]: r for r in records("cpu_attention", benchmark="cpu_steps", run="20261202T143929+0000")}
    quiet = {r["impl"]: r for r in records("cpu_attention", benchmark="cpu_steps", run="20261202T150442+0000")}
    slower = [busy[i]["median_s"] / quiet[i]["median_s"] for i in busy]
    best = min(r["time_s"] for r in sweep)
    ours = quiet["flash_numba_cpu"]
    assert 1.7 < best / ours["median_s"] < 2.1                  # the difference the text explains
    assert sweep[0]["run"] < "20261202T143929+0000" and "load_1min" not in sweep[0]
    assert f"({best:.3f} s at its fastest tiles, against {ours['min_s']:.3f}-{ours['max_s']:.3f} s" in text
    assert f"{min(slower):.1f}-{max(slower):.1f}x slower" in text
    loads = [x for r in busy.values() for x in r["load_1min"]]
    calm = [x for r in quiet.values() for x in r["load_1min"]]
    assert f"load of {min(loads):.1f}-{max(loads):.1f} against {min(calm):.1f}-{max(calm):.1f}" in text


def test_the_live_roof_is_printed_with_the_load_it_was_measured_under():
    """The live roof, which a busy machine pulls far below the record, is printed beside its load and the record."""
    code, out = source("l08-34"), output_of("08", "l08-34")
    assert "getloadavg" in code and "matmul_flops" in code
    assert "measured now under a 1-minute load of" in out and "x the one measured now" in " ".join(out.split())
    assert "says how busy the machine was" in cell_text("08", "l08-35")


def test_mkls_kernel_choice_is_said_to_be_unrecorded():
    words = markdown("08")
    assert "AVX-512 either way" not in words
    assert "Which of MKL's kernels ran is not recorded" in cell_text("08", "l08-s19c")


def test_measurements_without_a_record_quote_no_figure_and_two_runs_are_named_apart():
    words = markdown("08")
    assert "0.26 s, then 0.22 s" not in words and "measured, the hand-out stayed" not in words
    assert "tens of seconds" not in cell_text("08", "l08-24")
    assert "that left no record" in cell_text("08", "l08-s09") and "that left no record" in cell_text("08", "l08-s19c")
    text = cell_text("08", "l08-37")
    first = {r["threads"]: r["time_s"] for r in records("cpu_attention", benchmark="cpu_attention_threads",
                                                        run="20261202T144212+0000", impl="torch_sdpa_flash")}
    assert f"({first[2]:.1f} s against {first[1]:.2f} s, one call each, run 20261202T144212+0000)" in text
    rounds = {r["threads"]: r["rounds_s"] for r in records("cpu_attention", benchmark="cpu_attention_threads",
                                                           run="20261202T152607+0000", impl="torch_sdpa_flash")}
    assert (f"gave {min(rounds[2]):.2f}-{max(rounds[2]):.2f} s at two threads every time, "
            f"against {min(rounds[1]):.2f}-{max(rounds[1]):.2f} s at one") in text


def test_step_5_is_said_to_bundle_four_changes():
    text = cell_text("08", "l08-s01")
    assert "bundles four changes" in text and "cannot attribute it to any one of them" in text
    for change in ("in place of the micro-kernel", "no copies of the tiles", "scales $Q_i$ once", "one thread"):
        assert change in text
    assert "three details make it pay" not in cell_text("08", "l08-s05")


def test_ties_within_ten_percent_are_printed_within_the_noise_not_as_targets_met():
    out = " ".join(output_of("08", "l08-s18").split())
    met = out.split("targets met")[1].split("within the noise")[0]
    tied = out.split("within the noise")[1].split("causal speed-up")[0]
    run = "20261202T145802+0000"
    rows = records("cpu_attention", run=run)
    medians = {(r["impl"], tuple(r["shape"]), r["causal"]): r["median_s"] for r in rows
               if r["benchmark"] in ("cpu_targets", "cpu_decode")}
    ties = 0
    for (impl, shape, causal), t in medians.items():
        if impl != "flash_numba_cpu":
            continue
        x = medians[("torch_sdpa_flash", shape, causal)] / t
        said = f"{shape} {'causal ' if causal else ''}{x:.2f}x"
        assert said in (tied if abs(x - 1) < 0.10 else met), said
        ties += abs(x - 1) < 0.10
    assert ties > 0                                              # the rule has ties to print in this run
    (count,) = quoted(r"but (\w+) are ties by that rule", cell_text("08", "l08-s19"))
    assert count == ["none", "one", "two", "three", "four", "five", "six"][ties]
