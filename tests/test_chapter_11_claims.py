"""What chapter 11 says about low precision, held to FA3's source, the library and the records.

Each test reads the lecture's markdown (or a stored output) and fails when a sentence quotes a number its
record or the library does not give, or claims what they contradict: FA3's shifted P (``Max_offset = 8``
in ``hopper/softmax.h``), the CPU's cast against the GPU's saturating conversion, the error study's
seed-averaged outlier points, the KL penalty of a flushed weight, and the GPU section's records.
"""
import re

import numpy as np

from course_lib.lowp import fallback, formats, study

from lectures import cell, markdown, output_of, quoted, records, text


def _error_study():
    rows = records("lowp_error")
    run = rows[-1]["run"]
    return {(r["sweep"], r["x"], r["recipe"]): r for r in rows if r["run"] == run}


# -- FA3's fp8 P: 2**8 exp(S - m), in [0, 256] -------------------------------------------------------

def test_chapter_11_says_fa3_shifts_p_by_2_to_the_8_and_the_course_does_not():
    words = text("11", "l11-11")
    assert "Max_offset = 8" in words and "$[0, 256]$" in words and "$2^8 \\exp(S - m)$" in words
    assert "divides the row sum by $2^8$" in words
    assert study.RECIPES["fp8 FA3"].p_shift == 8 and study.RECIPES["fp8"].p_shift == 0
    bug = text("11", "l11-26")
    assert "$\\exp(S - m) \\le 1$ with its largest entry exactly 1" not in bug and "256" in bug


def test_chapter_11_puts_the_flush_threshold_where_each_recipe_has_it():
    words = text("11", "l11-24")
    plain, shifted = quoted(r"an entry of \$\\exp\(S - m\)\$ below \$2\^\{-(\d+)\}\$ of the row max, shifted by "
                            r"\$2\^8\$ \(FA3\) one below \$2\^\{-(\d+)\}\$", words)
    assert 2.0 ** -int(plain) == study.flush_below(study.RECIPES["fp8"])
    assert 2.0 ** -int(shifted) == study.flush_below(study.RECIPES["fp8 FA3"])
    assert "(`study.row_kl` floors it at float64's smallest normal, so each such entry costs $p(\\log p + 708)$" in words
    assert int(-np.log(np.finfo(np.float64).tiny)) == 708


def test_the_error_study_record_holds_fa3s_recipe_beside_the_unshifted_one():
    points = _error_study()
    assert points["length", 1024, "fp8 FA3"]["label"] == "inputs float8_e4m3fn, P float8_e4m3fn x 2^8"
    assert points["length", 1024, "fp8"]["label"] == "inputs float8_e4m3fn, P float8_e4m3fn"
    for n in (1024, 16384):   # "fp8's KL grows with the row length ... and FA3's does not grow"
        assert points["length", n, "fp8 FA3"]["kl_mean"] < points["length", n, "fp8"]["kl_mean"] / 5
    grow = [points["length", n, name]["kl_mean"] for name in ("fp8", "fp8 FA3") for n in (1024, 16384)]
    assert grow[1] > 10 * grow[0] and grow[3] < 1.1 * grow[2]


def test_chapter_11_prints_the_kl_of_its_record():
    points = _error_study()
    lines = output_of("11", "l11-23").splitlines()
    assert len(lines) == 4
    for line, (sweep, x) in zip(lines, (("length", 1024), ("length", 16384), ("scale", 2.0), ("scale", 8.0))):
        for name in ("fp8", "fp8 FA3", "bf16", "fp16"):
            assert f" {name} {points[sweep, x, name]['kl_mean']:.2e}" in line, (sweep, x, name)


def test_chapter_11_counts_the_flushed_keys_behind_each_oddity_of_the_kl():
    rows = {}
    case = None
    for line in output_of("11", "l11-25").splitlines()[1:]:
        found = re.match(r"\s*(Nk = \d+|logit scale \d+)?\s+(fp8 FA3|fp8|fp16|bf16)\s+([\d.]+)\s+(\S+)\s+(\S+)$", line)
        assert found, line
        case = found.group(1) or case
        rows[case, found.group(2)] = tuple(float(g) for g in found.groups()[2:])
    assert rows["Nk = 1024", "fp8 FA3"][0] == rows["Nk = 16384", "fp8 FA3"][0] == 0   # "flushes no key at all"
    assert rows["Nk = 16384", "fp8"][1] > 10 * rows["Nk = 1024", "fp8"][1]
    assert rows["logit scale 8", "fp16"][0] > 0 == rows["logit scale 8", "bf16"][0]
    # not monotone: more keys flushed at scale 8, less mass in them, less KL
    sharp, moderate = rows["logit scale 8", "fp8"], rows["logit scale 2", "fp8"]
    assert sharp[0] > moderate[0] and sharp[1] < moderate[1] and sharp[2] < moderate[2]
    for (_, name), (_, mass, kl) in rows.items():   # the KL is about 700 times the flushed mass
        assert kl < 0.2 or 0.9 * 700 * mass < kl < 1.1 * 710 * mass, name


# -- overflow: numpy's cast gives NaN, the GPU's conversion saturates ---------------------------------

def test_chapter_11_teaches_both_conversions():
    words = text("11", "l11-05")
    assert "`cvt.rn.satfinite.e4m3x2.f32`" in words and "**saturates**" in words
    assert "`formats.cast(x, dtype, saturate=True)`" in words
    shown = output_of("11", "l11-06").splitlines()
    saturating = next(line for line in shown if line.strip().startswith("e4m3, saturating"))
    plain = next(line for line in shown if line.strip().startswith("float8_e4m3fn"))
    assert saturating.split()[-2:] == ["4.4800e+02", "4.4800e+02]"] and plain.split()[-2:] == ["nan", "nan]"]
    x = np.array([465.0, 1e5], np.float32)
    assert np.isnan(formats.cast(x, "float8_e4m3fn").astype(np.float32)).all()
    assert (formats.cast(x, "float8_e4m3fn", saturate=True).astype(np.float32) == 448).all()


def test_the_fallback_gives_the_saturating_reason():
    words = text("11", "l11-32")
    assert "overflows to NaN" not in words and "clips such values to 448" in words
    shown = " ".join(output_of("11", "l11-33").split())
    clip = quoted(r"K's amax is ([\d.]+)x what its descale holds \(448 x descale\): fp8 would clip its largest "
                  r"values by (\d+)%", shown)
    assert f"{1 - 1 / float(clip[0]):.0%}" == f"{clip[1]}%"
    assert "NaN" not in fallback.__doc__.split("3. Otherwise")[0].split("2. fp8")[1].split("numpy")[0]
    chapter_13 = text("13", "l13-31")
    assert "overflows e4m3, which has no inf: NaN" not in chapter_13 and "`cvt.rn.satfinite`" in chapter_13


# -- chapter 11's minor claims --------------------------------------------------------------------

def test_chapter_11_puts_the_outlier_threshold_at_a_few_thousand():
    words = text("11", "l11-09")
    assert "a few thousand times the rest" in words and "a few hundred times" not in words
    shown = output_of("11", "l11-10").splitlines()
    flushed = [float(f) for f in re.findall(r"flushed ([\d.]+)% ->", "\n".join(shown))]
    assert flushed[0] == 0 < flushed[1]           # 64x: nothing flushes; 4096x: a few percent


def test_chapter_11_quotes_the_seed_averaged_outlier_points():
    points = _error_study()
    words = text("11", "l11-19")
    mean = {(f, name): points["outlier", f, name]["out_rel_rms"] for f in (1, 4, 16, 64, 256)
            for name in ("fp8", "fp8 per-tensor", "fp8 incoherent")}
    low, high, at_256 = quoted(r"at 256x single draws spread from ([\d.]+) to ([\d.]+) around a mean of ([\d.]+)", words)
    assert [low, high] == [f"{v:.2f}" for v in points["outlier", 256, "fp8"]["out_rel_rms_range"]]
    assert at_256 == f"{mean[256, 'fp8']:.2f}"
    within, at_256_within = quoted(r"its mean within\s+(\d+)% of per head's at every size, about (\d+)% at 256x", words)
    worst = max(abs(mean[f, "fp8 per-tensor"] / mean[f, "fp8"] - 1) for f in (1, 4, 16, 64, 256))
    assert worst <= int(within) / 100 < worst + 0.05
    assert round(100 * abs(mean[256, "fp8 per-tensor"] / mean[256, "fp8"] - 1)) == int(at_256_within)
    raised = quoted(r"raises the mean error \(([\d.]+) to ([\d.]+), ([\d.]+) to ([\d.]+)\)", words)
    assert list(raised) == [f"{mean[f, name]:.2f}" for f in (64, 256) for name in ("fp8", "fp8 incoherent")]
    assert "real activations" not in words and "synthetic outliers" in words
    assert len(points["outlier", 256, "fp8"]["seeds"]) == 8 and "mean over eight draws" in text("11", "l11-17")


def test_chapter_11_says_why_fp8_wgmma_needs_v_transposed():
    words = text("11", "l11-31")
    assert "K-major" in words and "`Transpose_V`" in words and "`permute_Cregs_fp8`" in words
    assert "its tensor cores read them as they are." not in words


def test_chapter_11_places_cutlass_split_and_the_tensor_core_backward():
    words = text("11", "l11-53")
    assert "CUTLASS splits each operand once, in shared memory" not in words
    assert "once per fragment it loads from shared memory" in words
    run = records("gpu_backward", run="20261206T074510+0000")
    checks = [r["verdict"].split()[0] for r in run if r["benchmark"] == "gpu_backward_check"]
    passed, cases = quoted(r"chapter 12's section 9: on an H100 it passes (\d+)\s+of the (\d+) awkward cases", words)
    assert (int(passed), int(cases)) == (checks.count("PASS"), len(checks))
    assert "## 9. On the tensor cores" in "".join(cell("12", "7eb1d32e")["source"])
    timed = [r for r in run if r["benchmark"] == "gpu_backward_time"]
    ratios = [next(p["median_s"] for p in timed if p["impl"] == "torch_sdpa_flash" and (p["D"], p["causal"]) ==
                   (r["D"], r["causal"])) / r["median_s"] for r in timed if r["impl"] == "cuda_mma_f16"]
    low, high = quoted(r"runs at ([\d.]+)-([\d.]+)x FlashAttention-2's backward", words)
    assert (low, high) == (f"{min(ratios):.2f}", f"{max(ratios):.2f}")


def test_chapter_11_quotes_no_instruction_count_without_a_record():
    words = text("11", "75acf69c")
    assert not re.search(r"900 instructions|515 instructions|227 to 167 registers", words)
    assert "were not recorded" in words


def test_chapter_11_says_which_sections_need_no_gpu():
    words = text("11", "l11-00")
    assert "on this machine, without a GPU" not in words and "Sections 1-8" in words
    assert "Section 9" in words and "records" in words


def test_chapter_11_markdown_names_fa3s_recipe_only_for_the_shifted_p():
    assert "P = exp(S - m) rounded to e4m3 before P V, as FA3 feeds its FP8 matrix unit" not in markdown("11")
