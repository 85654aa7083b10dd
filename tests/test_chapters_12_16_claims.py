"""What chapters 12, 15 and 16 say in prose, held to what the library and the records compute.

Each test reads a lecture's markdown (or a stored output, or the source of a cell) and fails when a
sentence quotes a number its record or the course's model does not give, or claims what they contradict.
Nothing here times anything: every number comes from a committed record or a model.
"""
import json
import re

import numpy as np
import pytest

from course_lib import bench
from course_lib.backward import cost
from course_lib.models.iomodel import flash_io

from conftest import REPO
from lectures import RECORDS, cell, markdown, output_of, quoted, records, text

# -- chapter 12 -------------------------------------------------------------------------------------

def test_the_recompute_price_counts_its_exponentials():
    t = cost.recompute_tradeoff(4096, 128, dtype="float16", hw="h200")
    assert t.exponentials == 4096 ** 2 and t.exp_s > 0
    assert t.recompute_s == pytest.approx(t.matmul_s + t.exp_s)
    # at d = 128 the exponentials (3.9 T/s) take as long as the 256 FLOPs per score (989 TFLOP/s): the ratio halves
    assert t.exp_s == pytest.approx(t.matmul_s, rel=0.02)
    assert t.ratio == pytest.approx(t.p_traffic_s / t.matmul_s / 2, rel=0.02)
    with pytest.raises(ValueError, match="exp_per_s"):
        cost.recompute_tradeoff(4096, 128, hw="a100_80gb")


def test_chapter_12_quotes_the_recompute_ratio_with_the_exponentials_priced():
    words = text("12", "l12-09")
    at_128, at_64, at_256 = quoted(r"beats moving \$P\$ by about ([\d.]+)x at \$d = 128\$.*?\(([\d.]+)x\).*?\(([\d.]+)x\)",
                                   words)
    for d, said in ((128, at_128), (64, at_64), (256, at_256)):
        assert said == f"{cost.recompute_tradeoff(4096, d, dtype='float16', hw='h200').ratio:.1f}", d
    flops_only = quoted(r"over \$d\$: ([\d.]+)x at \$d = 128\$", words)[0]
    t = cost.recompute_tradeoff(4096, 128, dtype="float16", hw="h200")
    assert flops_only == f"{t.p_traffic_s / t.matmul_s:.1f}"
    assert "by about 3x" not in words
    summary = text("12", "e6a2facf")
    assert quoted(r"recompute beats writing and reading \$P\$ by about ([\d.]+)x", summary)[0] == at_128
    # the table prints the exponentials' column (the lead re-executes the cell to refresh its output)
    assert "t.exp_s" in "".join(cell("12", "l12-08")["source"])


def _backward_time_run():
    timing = records("backward.jsonl", benchmark="backward_time")
    run = timing[-1]["run"]     # the run section 5's cell reads
    return {(r["impl"], r["D"], r["causal"]): r for r in timing if r["run"] == run}


def test_chapter_12_quotes_the_causal_ratios_of_its_record():
    by = _backward_time_run()
    ratio = {(impl, d): by[impl, d, True]["median_s"] / by[impl, d, False]["median_s"]
             for impl in ("flash_numba_cpu", "torch_sdpa") for d in (64, 128)}
    ours64, ours128, theirs64, theirs128 = quoted(
        r"costs ([\d.]+) of its full time at \$d = 64\$ and ([\d.]+) at \$d = 128\$.*?PyTorch's ([\d.]+) and ([\d.]+)",
        text("12", "l12-23"))
    assert ours64 == f"{ratio['flash_numba_cpu', 64]:.2f}" and ours128 == f"{ratio['flash_numba_cpu', 128]:.2f}"
    assert theirs64 == f"{ratio['torch_sdpa', 64]:.2f}" and theirs128 == f"{ratio['torch_sdpa', 128]:.2f}"


def test_chapter_12_quotes_the_recompute_share_of_its_record():
    shares = [r["recompute_share"]["median_s"] for (impl, _, _), r in _backward_time_run().items()
              if impl == "flash_numba_cpu"]
    low, high = quoted(r"The recompute \(\$Q K\^T\$ and the exponentials\) is (\d+)–(\d+) %", text("12", "l12-23"))
    assert (int(low), int(high)) == (round(100 * min(shares)), round(100 * max(shares)))


def test_chapter_12_quotes_the_earlier_tile_sweeps_as_recorded():
    """256 x 512 against 128 x 256 in runs 143608 and 144040, whichever of the two was the default."""
    gain = {False: [], True: []}
    for run in ("20261202T143608+0000", "20261202T144040+0000"):
        rows = records("backward.jsonl", benchmark="backward_tiles", run=run)
        for d in (64, 128):
            for causal in (False, True):
                big, small = (next(r for r in rows if r["D"] == d and r["causal"] == causal
                                   and (r["block_q"], r["block_k"]) == tile) for tile in ((256, 512), (128, 256)))
                gain[causal].append(small["median_s"] / big["median_s"])
    words = text("12", "l12-23")
    behind, ahead = quoted(r"had \$256 \\times 512\$ from (\d+) % behind to (\d+) % ahead", words)
    assert (int(behind), int(ahead)) == (round(100 * (1 - min(gain[False]))), round(100 * (max(gain[False]) - 1)))
    low, high = quoted(r"and (\d+)–(\d+) % behind under a causal mask", words)
    assert (int(low), int(high)) == (round(100 * (1 - max(gain[True]))), round(100 * (1 - min(gain[True]))))


def test_chapter_12s_memory_figure_reads_one_run():
    source = "".join(cell("12", "l12-19")["source"]).split("fig, ax")[0]
    scope = {"json": json, "RECORDS": RECORDS / "backward.jsonl"}
    exec(source, scope)
    pairs = [(r["impl"], r["Nq"]) for r in scope["memory"]]
    assert pairs and len(pairs) == len(set(pairs)), "the figure draws two runs' points on one line"


def test_chapter_12_claims_of_the_gpu_backward_are_in_its_record():
    words = markdown("12")
    assert "2.4 \\cdot 10^{-7}" not in words            # no record holds the size of the cancelled dQ
    verdict = next(r["verdict"] for r in records("gpu_backward.jsonl", case="empty_rows", run="20261206T074510+0000"))
    count, total = re.search(r"(\d+) of (\d+) elements differ", verdict).groups()
    assert f"{count} of the {total} elements of $dQ$" in words
    assert "spill to local memory, which is why" not in words   # no spill count recorded for the SIMT kernels
    assert "record holds no register or spill count" in words
    assert "$N^2$ bytes per head" not in words                  # P is N^2 elements, 2 N^2 bytes in float16


# -- chapter 15 -------------------------------------------------------------------------------------

def _table(chapter, cell_id):
    return output_of(chapter, cell_id).splitlines()


def test_chapter_15_quotes_double_bufferings_cut_at_each_tile():
    rows = {}
    for line in _table("15", "l15-11"):
        m = re.match(r"\s*(\d+) x (\d+)\s+(\d)\s.*\s([\d.]+)$", line)
        if m:
            rows[int(m[1]), int(m[2]), int(m[3])] = float(m[4])
    cut = {tile: 1 - rows[(*tile, 2)] / rows[(*tile, 1)] for tile in ((64, 64), (128, 64))}
    small, large = quoted(r"cuts the time by (\d+)% at \$64 \\times 64\$.*?and by (\d+)% at \$128 \\times 64\$",
                          text("15", "l15-12"))
    assert (int(small), int(large)) == (round(100 * cut[64, 64]), round(100 * cut[128, 64]))


def test_chapter_15_explains_the_two_panels_compute_alone():
    rows = bench.latest_run(bench.load_records(RECORDS / "edge_dma.jsonl", benchmark="edge_dma"))
    compute = {r["bandwidth"]: r["parts"]["compute_s"]["median"] for r in rows}
    slow, fast, ratio = quoted(r"(\d+) ms a tile at 12.5 MB/s against (\d+) ms at 25 MB/s \(([\d.]+)x\)",
                               text("15", "l15-18"))
    assert slow == f"{compute[12.5e6] * 1e3:.0f}" and fast == f"{compute[25e6] * 1e3:.0f}"
    assert ratio == f"{compute[12.5e6] / compute[25e6]:.2f}"


def test_chapter_15s_uint8_p_is_clamped_as_the_code_clamps_it():
    assert 65536 >> 8 == 256 > np.iinfo(np.uint8).max
    assert "np.minimum(p >> 8, 255)" in (REPO / "course_lib" / "edge" / "fixed_point.py").read_text()
    assert r"\min(P \gg 8, 255)" in text("15", "l15-18")


def test_chapter_15_calls_uint8_p_the_largest_error_by_the_tables_factor():
    table = {}
    for line in _table("15", "l15-21")[1:]:
        *name, unit, sharp = line.split()
        table[" ".join(name)] = (float(unit), float(sharp))
    table_row = table["+ 8-bit exp table, Q16 P, int8 V"]
    uint8 = table["+ P in uint8 (8-bit table): all int8 / int32"]
    integer_route = [v for k, v in table.items() if not k.startswith("fp8")]
    assert max(integer_route) == uint8        # the largest error of the integer route, at both settings
    words = text("15", "l15-22")
    assert "is the largest error of the integer route" in words
    factor, before, after, sharp = quoted(r"([\d.]+)x the error before it at unit variance \(([\d.]+) to ([\d.]+)\) "
                                          r"and ([\d.]+)x at the sharper", words)
    assert (before, after) == (f"{table_row[0]:.4f}", f"{uint8[0]:.4f}")
    assert factor == f"{uint8[0] / table_row[0]:.1f}" and sharp == f"{uint8[1] / table_row[1]:.1f}"
    assert "roughly doubles" not in words


def test_chapter_15_prices_gap8s_cluster_at_its_own_clock():
    """GreenWaves: the fabric controller runs at up to 250 MHz, the cluster at up to 175 MHz."""
    from course_lib.core.hardware import hardware
    from course_lib.edge import manycore
    gap8 = hardware("gap8")
    assert float(gap8.peak_flops["int8"]) == pytest.approx(8 * 175e6 * 4 * 2)
    one = manycore.cluster_step(1, 16, 64, 64, "gap8", layout=manycore.PRIVATE)
    words = text("15", "l15-31")
    crossover = quoted(r"Private tiles stop scaling between \d and \d cores \(at ([\d.]+) in the model\)", words)[0]
    assert crossover == f"{one.compute_s / one.dma_s:.1f}"
    assert "175 MHz" in words


# -- chapter 16 -------------------------------------------------------------------------------------

def _capstone(group):
    cap = bench.latest_run(bench.load_records(RECORDS / "capstone_cpu.jsonl", benchmark="capstone"))
    return [r for r in cap if r["group"] == group]


def test_chapter_16_quotes_the_second_cores_gain_of_its_record():
    cores = {r["threads"]: r for r in _capstone("bandwidth")}
    words = text("16", "c16-05")
    gain = quoted(r"the second core gave ([\d.]+)x in the fastest rounds", words)[0]
    assert gain == f"{cores[1]['min_ms'] / cores[2]['min_ms']:.2f}"
    slow, total = quoted(r"(\d+) of the (\d+) two-core rounds ran at one core's speed", words)
    two = np.array(cores[2]["times_ms"])
    assert int(total) == len(two) and int(slow) == int(np.sum(two > 0.9 * cores[1]["min_ms"]))
    assert "gains much less than 2x" not in words


def test_chapter_16_quotes_the_modelled_traffic_ratio_at_the_tiles_the_kernel_ran():
    rows = [r for r in _capstone("length") if r["path"] == "native"]
    ratios = [r["model_naive_bytes"] / r["model_flash_bytes"] for r in rows]
    tile = {(r["block_q"], r["block_k"]) for r in rows}
    words = text("16", "c16-09")
    block_q, block_k = quoted(r"With the \$(\d+) \\times (\d+)\$ tiles the kernel ran", words)
    assert tile == {(int(block_q), int(block_k))}
    low, high = quoted(r"naive moves ([\d.]+)-([\d.]+)x the tiled kernel's bytes", words)
    assert (low, high) == (f"{min(ratios):.1f}", f"{max(ratios):.1f}")
    assert "differ by only 2x" not in words


def _matrix_prefill(dtype, path):
    run = bench.latest_run(bench.load_records(RECORDS / "matrix_cpu.jsonl", benchmark="matrix"))
    return next(r for r in run if r["workload"] == "summarise" and r["bucket"] == "prefill" and r["mask"] == "none"
                and r["dtype"] == dtype and r["path"] == path)


def test_chapter_16_says_sdpas_half_precisions_are_slower_as_its_table_says():
    f32 = _matrix_prefill("float32", "public")["min_ms"]
    words = text("16", "c16-12")
    bf16, f16 = quoted(r"bfloat16 ([\d.]+)x and float16 ([\d.]+)x its float32 time", words)
    assert bf16 == f"{_matrix_prefill('bfloat16', 'public')['min_ms'] / f32:.1f}"
    assert f16 == f"{_matrix_prefill('float16', 'public')['min_ms'] / f32:.1f}"
    assert "bfloat16 is faster than its float32" not in words


def test_chapter_16_names_the_larger_float16_ratio_rightly():
    conv = {r["case"]: r for r in _capstone("conversion")}
    whole, bare = conv["float16 call"], conv["kernel, no rounding (the float32 launch)"]
    n16, n32 = _matrix_prefill("float16", "native"), _matrix_prefill("float32", "native")
    words = text("16", "c16-20")
    f32, f16 = quoted(r"float32 ([\d.]+)x, float16 ([\d.]+)x", words)
    assert (f32, f16) == (f"{n32['min_ms'] / bare['min_ms']:.2f}", f"{n16['min_ms'] / whole['min_ms']:.2f}")
    in_matrix, in_bench = quoted(r"([\d.]+)x in the matrix, the larger, and ([\d.]+)x in the benchmark", words)
    assert in_matrix == f"{n16['min_ms'] / n32['min_ms']:.2f}" and in_bench == f"{whole['min_ms'] / bare['min_ms']:.2f}"
    assert float(in_matrix) > float(in_bench)
    assert "the matrix's ratio is the smaller" not in words


def test_chapter_16_bounds_the_mask_gain_by_the_tile_work_as_measured():
    rows = _capstone("mask")
    native = [r for r in rows if r["path"] == "native"]
    none = next(r for r in native if r["mask"] == "none")
    gains, tile_ratios = [], []
    for r in native:
        if r is none:
            continue
        tiles = flash_io(r["N"], r["N"], r["D"], "float32", batch=r["B"], heads=r["H"], block_q=r["block_q"],
                         block_k=r["block_k"], window_size=tuple(r["window_size"]), causal=r["mask"] == "causal").flops
        gains.append(none["min_ms"] / r["min_ms"])
        tile_ratios.append(none["flops"] / tiles)
    words = text("16", "c16-16")
    g_low, g_high, t_low, t_high = quoted(r"the gains are ([\d.]+)-([\d.]+)x for tile work ratios of ([\d.]+)-([\d.]+)x",
                                          words)
    assert (g_low, g_high) == (f"{min(gains):.1f}", f"{max(gains):.1f}")
    assert (t_low, t_high) == (f"{min(tile_ratios):.1f}", f"{max(tile_ratios):.1f}")
    assert all(g < t for g, t in zip(gains, tile_ratios))
    assert np.argsort(gains).tolist() != np.argsort(tile_ratios).tolist()    # "not in the same order"
    assert "gain follows the work in the tiles" not in words


def test_chapter_16s_planted_regression_is_flagged_alone_by_a_rule_that_sees_the_machine():
    """The demo that teaches "a regression only beyond the noise" once flagged the unchanged no-mask bucket
    too: the two versions ran one after the other, and three rounds' noise cannot see a load that stays."""
    source = "".join(cell("16", "c16-planted-run")["source"])
    assert "matrix.run_pair(" in source and "matrix.run(" not in source   # both versions in the same rounds
    out = output_of("16", "c16-planted-run")
    flagged = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert len(flagged) == 1 and "window" in flagged[0] and flagged[0].endswith(" native"), out
    assert "1 regression(s)" in out and "machine drift" in out
    words = text("16", "c16-noise")
    for rule in ("the same machine", "stepping", "the machine's drift", "the noise of both runs", "the load each run met"):
        assert rule in words, rule


def test_chapter_16_knows_split_kv_decode_was_measured_in_chapter_10():
    words = text("16", "c16-25")
    assert "would fix" not in words
    assert "chapter 10's split-KV" in words
    # chapter 10's decode sweep: the rule's splits are faster than one block per row
    sweep = [r for r in records("gpu_steps.jsonl", benchmark="gpu_steps_decode") if r["impl"].startswith("cuda_")
             and r.get("median_ms")]
    for d in {r["D"] for r in sweep}:
        mine = sorted((r for r in sweep if r["D"] == d), key=lambda r: r["splits"])
        assert mine[0]["splits"] == 1 and min(r["median_ms"] for r in mine) < mine[0]["median_ms"] / 2


# -- chapter 11 -------------------------------------------------------------------------------------

def test_chapter_11_names_fa3s_ablation_rows_as_table_2_does():
    from course_lib.lowp import overlap

    rows = overlap.PUBLISHED["ablation_rows"]
    assert rows["pingpong"] == "no GEMM-softmax pipelining, with warp specialization"
    assert rows["intra"] == "GEMM-softmax pipelining, no warp specialization"
    out = output_of("11", "l11-38")
    assert all(rows[name] in out for name in ("pingpong", "intra"))


def test_chapter_11_says_fa2_copies_with_cp_async_and_lacks_tma_wgmma_and_warp_specialisation():
    cell_text = text("11", "l11-39")
    assert "synchronous copies" not in cell_text
    assert all(word in cell_text for word in ("`cp.async`", "TMA", "`wgmma`", "warp specialisation"))


def test_chapter_11_puts_3xtf32s_spills_where_ptxas_found_them():
    first = records("ptxas_resources")[0]["run"]                   # the run of the steps chapter 11's counters read
    runs = records("ptxas_resources", step="mma_3xtf32", run=first)
    d128 = [r["spill_stores"] for r in runs if r["D"] == 128]
    fastest_d64 = [r["spill_stores"] for r in runs if r["D"] == 64 and r["tiling"]["warps"] == 8
                   and r["tiling"]["Bc"] == 32 and r["tiling"]["stages"] == 1 and not r["tiling"]["ldmatrix"]]
    low, high = quoted(r"at D = 128 every tiling spills \((\d+)-(\d+) bytes a thread", text("11", "l11-51"))
    assert min(d128) > 0 and (int(low), int(high)) == (min(d128), max(d128))
    assert fastest_d64 == [0] and "spills nothing" in text("11", "l11-51")
    assert "pays in spills at every tiling" not in markdown("11")


def test_chapter_11_judges_decode_by_its_bytes_against_the_card_and_fa2():
    run = records("gpu_mma", run="20261206T074745+0000", benchmark="gpu_mma_decode")
    ours = {r["splits"]: r["median_s"] for r in run if r["impl"] == "cuda_mma_f16" and r["tiling"]["warps"] == 1}
    peer = {r["impl"]: r["median_s"] for r in run if r["impl"].startswith("torch")}
    B, H, Nk, D = run[0]["B"], run[0]["H"], run[0]["Nk"], run[0]["D"]
    kv_bytes = B * H * Nk * D * 2 * 2                          # K and V, fp16, one K / V head per query head
    cell = text("11", "b71f2a0b")
    assert f"moves {kv_bytes / 1e9:.2f} GB" in cell
    assert f"32 pieces ran {ours[32] * 1e3:.3f} ms, {kv_bytes / ours[32] / 1e12:.2f} TB/s" in cell
    assert f"({kv_bytes / ours[32] / 3.35e12:.0%} of the datasheet)" in cell
    assert f"FlashAttention-2's {kv_bytes / peer['torch_sdpa_flash'] / 1e12:.2f} TB/s" in cell
    assert f"cuDNN's {kv_bytes / peer['torch_sdpa_cudnn'] / 1e12:.2f} TB/s" in cell
    assert f"({peer['torch_sdpa_flash'] / ours[32]:.2f}x FlashAttention-2)" in cell
    assert f"would need {4 * kv_bytes / ours[1] / 1e12:.2f} TB/s" in cell and 4 * kv_bytes / ours[1] > 3.35e12
    assert f"64 pieces: {kv_bytes / ours[64] / 1e12:.2f}" in cell and ours[64] > ours[32]
    assert "no longer makes more pieces slower" not in markdown("11")


# -- chapters 13 and 14 ----------------------------------------------------------------------------

def _model_eval(table):
    rows = records("model_eval.jsonl", table=table)
    run = max(r["run"] for r in rows)
    return [r for r in rows if r["run"] == run]


def test_chapter_13_says_split_kv_never_paid_here_and_why():
    split = [r for r in _model_eval("split-KV decode") if r["splits"] > 1]
    low, high = quoted(r"Here it never paid: all (?:\w+) split rows above ran at ([\d.]+)-([\d.]+)x one call's speed",
                       text("13", "l13-21"))
    speed = [r["speedup_vs_one_split"] for r in split]
    assert max(speed) < 1 and (low, high) == (f"{min(speed):.2f}", f"{max(speed):.2f}")
    cores = split[0]["environment"]["cpu_cores"]["usable"]
    assert f"has {cores} cores" in text("13", "l13-21") or f"has {cores}\ncores" in text("13", "l13-21")
    assert max(r["splits"] for r in split) > cores and "oversubscribe" in text("13", "l13-21")


def test_chapter_13_quotes_the_custom_mask_rows_as_recorded():
    rows = _model_eval("custom masks")
    whole = [r for r in rows if r["layer"] == "whole forward pass"]
    assert quoted(r"the whole forward pass, \$N = (\d+)\$", text("13", "l13-28"))[0] == str(whole[0]["shape"]["seqlen_q"])
    by = {(r["mask"].split()[0], r["layer"], r["path"]): r for r in rows}
    words = text("13", "l13-30")
    assert quoted(r"whole model at \$N = (\d+)\$", words)[0] == str(whole[0]["shape"]["seqlen_q"])
    fast, dense = by["PrefixLMMask", "whole forward pass", "fast"], by["PrefixLMMask", "whole forward pass", "dense"]
    assert quoted(r"prefix-LM rewrite is ([\d.]+)x slower", words)[0] == f"{fast['seconds'] / dense['seconds']:.1f}"
    one = {m: by[m, "one attention call", "fast"] for m in ("DocumentMask", "PrefixLMMask")}
    done, of = quoted(r"document mask's rewrite computes (\d+) of (\d+) tiles", words)
    assert (int(done), int(of)) == (one["DocumentMask"]["tiles_computed"], one["DocumentMask"]["tiles_in_all"])
    assert quoted(r"and runs ([\d.]+)x faster", words)[0] == f"{one['DocumentMask']['speedup_vs_dense']:.1f}"
    p = one["PrefixLMMask"]
    assert quoted(r"skips only (\d+)% of the tiles", words)[0] == f"{1 - p['tiles_computed'] / p['tiles_in_all']:.0%}"[:-1]
    assert quoted(r"and still runs ([\d.]+)x faster", words)[0] == f"{p['speedup_vs_dense']:.1f}"


def test_chapter_13_measures_no_prefill_attention_share_and_says_so():
    words = text("13", "l13-24")
    assert "dominated by everything but attention" not in words and "not measured here" in words
    assert "load outlier" in "".join(cell("13", "l13-25")["source"])


def _gloo_run():
    rows = records("parallel_comm.jsonl", backend="gloo")
    run = max(r["run"] for r in rows)
    return [r for r in rows if r["run"] == run]


def test_chapter_14_counts_ulysses_out_and_lse_in_float32_as_its_code_does():
    from course_lib.parallel import costmodel
    shape = dict(batch=1, heads=32, heads_k=32, seqlen=131072, head_dim=128, itemsize=2)
    ratio = {w: costmodel.ring_bytes(world_size=w, **shape) / costmodel.ulysses_bytes(world_size=w, **shape)
             for w in (4, 8, 16)}
    assert all(0.38 * w < r < 0.42 * w for w, r in ratio.items())   # 0.4 W, not W / 2
    words = text("14", "9a5b369f")
    assert "about $0.4\\,W$ times the bytes of Ulysses" in words and "$W/2$ times" not in words.split("not $W/2$")[0]
    assert "H (D_v + 1)\\, a" in text("14", "f729f674") and "$\\approx W/2$" not in text("14", "5db2c994")
    assert "cannot overlap" not in text("14", "4b85f228") and "replicate" in words


def test_chapter_14_says_overlap_moved_the_cost_into_the_compute():
    by = {(r["seqlen"], r["overlap"]): r for r in _gloo_run() if r["kind"] == "overlap" and r["strategy"] == "ring"}
    off, on = by[1024, False], by[1024, True]
    words = text("14", "c1a8743f")
    wall = quoted(r"wall time fell only from (\d+) to (\d+) ms", words)
    compute = quoted(r"the compute grew from (\d+) to (\d+) ms", words)
    assert wall == (f"{off['wall_s']['median'] * 1e3:.0f}", f"{on['wall_s']['median'] * 1e3:.0f}")
    assert compute == (f"{off['compute_s']['median'] * 1e3:.0f}", f"{on['compute_s']['median'] * 1e3:.0f}")


def test_chapter_14_puts_the_alpha_beta_misfit_in_the_minimum_and_measures_no_collective_latency():
    run = _gloo_run()
    fit = next(r for r in run if r["kind"] == "alpha_beta")
    big = max((r for r in run if r["kind"] == "pingpong"), key=lambda r: r["bytes"])
    line = fit["alpha_s"] + big["bytes"] / fit["beta_bytes_per_s"]
    words = text("14", "16bdfbe4")
    size, times = quoted(r"at (\d+) MiB even the least disturbed round, the minimum, takes ([\d.]+)x", words)
    assert int(size) == big["bytes"] // 2 ** 20 and times == f"{big['min_s'] / line:.1f}"
    assert "several times the point-to-point" not in words and "not measured here" in words


def test_chapter_14_speaks_of_the_nvlink_run_as_not_made():
    assert not list(RECORDS.glob("parallel_comm_*.jsonl"))   # when it exists, the chapter should read it
    words = text("14", "bf6e9e1e")
    assert "No such run has been made yet" in words and "is what the 2-GPU run records" not in words
