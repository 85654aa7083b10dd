"""What chapters 09 and 10 say in prose, held to their stored outputs and the records they read.

Each test reads a lecture's markdown (or a code cell's source or stored output) and fails when a
sentence states a number or an explanation that the record it describes contradicts.
"""
import re
import statistics

from course_lib.kernels.cuda_steps.tiling import STEP_TILING

from lectures import output_of, records
from lectures import text as cell_text

FMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
SHARED_LD = "smsp__inst_executed_op_shared_ld.sum"
WAVES = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"









def counters(name="gpu_counters.jsonl"):
    return {(r["step"], r["D"]): r for r in records(name)}


def loads_per_fma(c):
    return c[SHARED_LD] / (c[FMA] / 32)


def plain_runs(case):
    """Per run of the sanitizer corpus: did the buggy kernel, run without a tool, give the right answer."""
    return [r["plain_run"]["matches_spec"] for r in records("sanitizer_corpus.jsonl")
            if r["case"] == case and r["variant"] == "buggy" and r["tool"] == "racecheck"]


def steps_record(impl, d, causal=False, n=4096):
    return next(r for r in records("gpu_steps.jsonl") if r["benchmark"] == "gpu_steps" and r["impl"] == impl
                and r["D"] == d and r["causal"] == causal and r["Nk"] == n)


def chain_median(step, d, causal=False):
    return statistics.median(r["median_ms"] for r in records("gpu_steps_chain.jsonl")
                             if r["benchmark"] == "gpu_steps_chain" and r["impl"] == f"cuda_{step}"
                             and r["D"] == d and r["causal"] == causal)


# ---- chapter 09 -------------------------------------------------------------------------------

def test_chapter_09_says_block_reversal_without_a_barrier_was_wrong_on_the_gpu_as_recorded():
    text = cell_text("09", "l09-12")
    runs = plain_runs("reverse_no_barrier")
    assert "right answer most of the time" not in text
    assert f"wrong answer in {runs.count(False)} of {len(runs)} runs" in text
    # the races it names as surviving testing gave the right answer in every run
    for case in ("tile_loop_no_second_barrier", "matmul_no_second_barrier", "tree_sum_barrier_outside_loop"):
        assert all(plain_runs(case)), case
    assert "flagged (0)" in text   # the table's racecheck column is explained (warnings, no errors)
    assert any(r["sanitizer"]["flagged"] and r["sanitizer"]["errors"] == 0
               and r["sanitizer"]["messages"][0].startswith("Warning")
               for r in records("sanitizer_corpus.jsonl") if r["tool"] == "racecheck")


def test_chapter_09_calls_an_early_return_before_a_barrier_undefined_not_a_hang():
    text = cell_text("09", "l09-22")
    runs = plain_runs("early_return_before_barrier")
    assert "waiting forever" not in text
    assert len(runs) == 3 and all(runs)
    assert "right answer in all three H200 runs" in text
    assert "undefined" in text and "share of" in text


def test_chapter_09_quotes_the_global_reads_step_2_saves_from_cudachecks_counts():
    reads = [int(re.search(r"\((\d+) global reads", output_of("09", cell)).group(1)) for cell in ("l09-21", "l09-23")]
    text = cell_text("09", "l09-22")
    assert f"{reads[0]:,} to {reads[1]:,} global reads ({reads[0] / reads[1]:.1f}x)" in text


def test_chapter_09_counts_a_v_element_per_multiply_add_of_p_v():
    text = cell_text("09", "l09-39")
    assert "for every other one" not in text
    assert "a $V_j$ element for every multiply-add of $P V$" in text


def test_chapter_09_says_longer_key_tiles_were_not_faster_for_one_warp_blocks():
    latest = max(r["run"] for r in records("gpu_attention.jsonl"))
    sweep = {(r["shape"][4], r["block_q"], r["block_k"]): r["tflops"] for r in records("gpu_attention.jsonl")
             if r["benchmark"] == "gpu_attention_blocks" and r["run"] == latest}
    text = cell_text("09", "l09-39")
    assert sweep[64, 32, 64] < sweep[64, 32, 32] and sweep[128, 32, 32] < sweep[128, 32, 16]
    assert (f"$B_c = 64$ ran {sweep[64, 32, 64]:.1f} against {sweep[64, 32, 32]:.1f} TFLOP/s" in text
            and f"{sweep[128, 32, 32]:.1f} against {sweep[128, 32, 16]:.1f}" in text)


def test_chapter_09_names_shared_memory_as_the_d128_kernels_main_wait():
    row = counters()["row", 128]["counters"]
    stalls = {m: v for m, v in row.items() if "stalled" in m and "selected" not in m}
    assert "short_scoreboard" in max(stalls, key=stalls.get)
    text = cell_text("09", "l09-41")
    assert "limited by register spills" not in text
    assert "waiting mostly on shared memory" in text


# ---- chapter 10 -------------------------------------------------------------------------------

def test_chapter_10_section_2_says_one_load_per_fma_is_numerology_and_quotes_rows_counters():
    text = cell_text("10", "756dbc35")
    row = counters()["row", 64]["counters"]
    assert "That is what chapter 09 measured" not in text
    assert "coincidence" in text
    assert f"{loads_per_fma(row):.3f} shared-load instructions per FMA" in text
    assert f"{row['smsp__inst_executed.sum'] / (row[FMA] / 32):.2f} instructions per FMA" in text


def tiled_passes(D, with_row_max):
    """Shared-memory passes per load of `tiled` (its layout, its warp of 4 rows x 8 keys), counted from
    the addresses each load instruction of one key tile reads: a bank serves one 4-byte word a pass,
    threads reading the same word share it."""
    t = STEP_TILING["tiled"]
    L = t.layout(D, D)
    TX, TY, RM, RN, RE = t.tx, t.ty, t.rm, t.rn, L.RE
    warp = [(lane % TX, lane // TX) for lane in range(32)]     # (tx, ty) of warp 0

    def passes(address):
        words = {address(tx, ty) for tx, ty in warp}
        return max(sum(1 for w in words if w % 32 == bank) for bank in range(32))
    loads = []
    for d in range(D):
        loads += [lambda tx, ty, r=r: L.QS + (ty + TY * r) * L.DP + d for r in range(RM)]
        loads += [lambda tx, ty, c=c: L.KS + (tx + TX * c) * L.DP + d for c in range(RN)]
    if with_row_max:
        loads += [lambda tx, ty, r=r, x=x: L.RED + (ty + TY * r) * TX + x for r in range(RM) for x in range(TX)]
    for c in range(t.Bc):
        loads += [lambda tx, ty, r=r: L.PS + (ty + TY * r) * L.BP + c for r in range(RM)]
        loads += [lambda tx, ty, e=e: L.VS + c * L.EP + tx + TX * e for e in range(RE)]
    return sum(passes(a) for a in loads) / len(loads)


def test_chapter_10s_bank_conflict_count_is_the_kernels_and_matches_the_counters():
    text = cell_text("10", "a7ba9f23")
    got = counters()
    measured = [got[s, d]["counters"][WAVES] / got[s, d]["counters"][SHARED_LD]
                for s in ("tiled", "tiled_unsigned") for d in (64, 128)]
    assert "which do not conflict" not in text
    assert "4-way conflicts of $Q$'s and $P$'s loads" in cell_text("10", "4939e41f")   # section 4 says what it missed
    assert f"**{tiled_passes(64, False):.2f}** ({tiled_passes(128, False):.2f} at D = 128)" in text
    assert f"against the measured {min(measured):.2f}-{max(measured):.2f}" in text
    for d in (64, 128):   # with the row max's reads, the count is `tiled`'s measured passes
        c = got["tiled", d]["counters"]
        assert abs(tiled_passes(d, True) - c[WAVES] / c[SHARED_LD]) < 0.01
        assert f"{tiled_passes(d, True):.2f}" in text


def test_chapter_10_says_a_16_byte_load_takes_several_passes_without_conflicts_and_shows_the_counter():
    assert "one per instruction without bank conflicts" not in cell_text("10", "0613539d")
    assert CONFLICTS in cell_text("10", "ee67b2fe")
    got = counters()
    vec = [got[s, d]["counters"] for s in ("tiled_vec4", "tiled_staged", "tuned") for d in (64, 128)]
    assert all(c[CONFLICTS] / c[SHARED_LD] < 0.005 for c in vec)
    passes = [c[WAVES] / c[SHARED_LD] for c in vec]
    assert f"{min(passes):.2f}-{max(passes):.2f} passes with no bank conflict" in cell_text("10", "a7ba9f23")


def test_chapter_10_does_not_say_the_tuned_kernel_issues_every_cycle():
    text = cell_text("10", "a7ba9f23")
    got = counters()
    assert "has work every cycle" not in text
    busy = [got["tuned", d]["counters"]["sm__throughput.avg.pct_of_peak_sustained_elapsed"] for d in (64, 128)]
    assert f"{busy[0]:.1f}% at D=64 and {busy[1]:.1f}% at D=128" in text
    assert max(busy) < 70     # a third of the issue slots, at least, go empty


def test_chapter_10_quotes_tiled_rebuilts_registers_from_the_chain_record():
    regs = counters("gpu_counters_chain.jsonl")["tiled_rebuilt", 64]["resources"]["regs_per_thread"]
    quoted = re.search(r"Its (\d+) registers", cell_text("10", "169a5d74")).group(1)
    assert int(quoted) == regs


def test_chapter_10_does_not_credit_the_16_byte_loads_to_the_alignment_declaration():
    chain = counters("gpu_counters_chain.jsonl")
    before, after = (loads_per_fma(chain[s, 64]["counters"]) for s in ("tiled_rebuilt", "tiled_aligned"))
    assert before < 0.12 and abs(after - loads_per_fma(chain["tiled_reorder", 64]["counters"])) < 0.001
    wrong = ("because the shared buffer is declared with `alignment=16`",
             "a shared array declared with `alignment=16`, every row",
             "which Numba gives only when the compiler can prove the alignment",
             "credits the 16-byte loads with none of it")
    for cell in ("0db8c97c", "4939e41f", "f1da560f"):
        text = cell_text("10", cell)
        assert not any(w in text for w in wrong), cell
    for cell in ("0db8c97c", "4939e41f"):
        assert f"{before:.3f}" in cell_text("10", cell) and f"{after:.3f}" in cell_text("10", cell)


def test_chapter_10_says_the_grid_orders_lost_l2_reuse_was_paid_in_time():
    chain_counters = counters("gpu_counters_chain.jsonl")
    ratios = [chain_median("tiled_shuffle", d) / chain_median("tiled_reorder", d) for d in (64, 128)]
    waits = [chain_counters[s, 128]["counters"]["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"]
             for s in ("tiled_shuffle", "tiled_reorder")]
    traffic = cell_text("10", "ea123274")
    assert "price is not paid in time" not in traffic
    assert f"{ratios[0]:.2f}x at D = 64 and {ratios[1]:.2f}x at D = 128" in traffic
    assert f"from {waits[0]:.2f} to {waits[1]:.2f}" in traffic
    closing = cell_text("10", "f1da560f")
    assert "free at these speeds" not in closing
    assert f"{1 - ratios[0]:.0%} at D=64 and {1 - ratios[1]:.0%} at D=128" in closing
    causal = [chain_median("tiled_shuffle", d, True) / chain_median("tiled_reorder", d, True) for d in (64, 128)]
    assert "We did not time the new kernel with the old" not in cell_text("10", "51614eb3")
    assert (f"gained {causal[0] - 1:.0%} at D = 64 and lost {1 - causal[1]:.0%} at D = 128"
            in cell_text("10", "51614eb3"))


def test_chapter_10_quotes_tileds_loss_to_row_at_both_head_dims():
    loss = [steps_record("cuda_tiled", d)["median_ms"] / steps_record("cuda_row", d)["median_ms"] for d in (64, 128)]
    assert f"**{loss[0]:.1f}x slower** than `row` at D=64 ({loss[1]:.1f}x at D=128)" in cell_text("10", "4939e41f")
    assert f"{loss[0]:.1f}x (D=64) and {loss[1]:.1f}x (D=128) *slower*" in cell_text("10", "f1da560f")


def test_chapter_10_quotes_unsplit_and_split_decode_against_naive_torch():
    dec = [r for r in records("gpu_steps.jsonl") if r["benchmark"] == "gpu_steps_decode"]
    rule = {r["D"]: r["splits"] for r in records("gpu_steps.jsonl") if r["benchmark"] == "gpu_steps_decode_rule"}
    slower = {}
    for d in (64, 128):
        naive = next(r for r in dec if r["D"] == d and r["impl"] == "torch_naive")["median_ms"]
        mine = {r["splits"]: r["median_ms"] for r in dec if r["D"] == d and r["impl"].startswith("cuda_")}
        slower[d] = (mine[rule[d]] / naive, mine[min(mine)] / naive)
    text = cell_text("10", "f1da560f")
    assert "split or not, is 5-16x" not in text
    assert (f"{slower[64][0]:.1f}x (D=64) and {slower[128][0]:.0f}x (D=128) slower than naive torch's "
            f"matrix-vector products when split, {slower[64][1]:.0f}x and {slower[128][1]:.0f}x unsplit") in text


def test_chapter_10s_thin_margin_is_measured_against_the_runs_own_spread():
    spread = max((max(r["times_ms"]) - min(r["times_ms"])) / r["median_ms"]
                 for r in (steps_record("cuda_tuned", 128), steps_record("torch_naive", 128)))
    assert spread < 0.01
    assert "twice the spread" not in cell_text("10", "4939e41f")
    assert "about twice the timing spread" not in cell_text("10", "f1da560f")
    assert "under 1%" in cell_text("10", "4939e41f")


def test_chapter_10_sizes_s_and_p_at_32k_as_the_bench_counts_them():
    skipped = next(r["skipped"] for r in records("bench.jsonl") if r.get("impl") == "torch_naive"
                   and r.get("Nq") == 32768 and r.get("dtype") == "float32" and r.get("skipped"))
    s = 16 * 32768 ** 2 * 4 / 2 ** 30
    assert "(192 GiB)" in skipped and 3 * s == 192
    for cell in ("0d0fb5a8", "eee9c917"):
        text = cell_text("10", cell)
        assert f"$S$ and $P$ take {2 * s:.0f} GiB" in text and "scaled copy of $S$" in text, cell


def test_chapter_10_does_not_blame_end_to_end_time_on_untimed_copies():
    text = cell_text("10", "0d0fb5a8")
    assert "the copies of Q, K, V and O over PCIe cost more than the kernel" not in text
    e2e = next(r for r in records("gpu_steps.jsonl") if r["benchmark"] == "gpu_steps_layers"
               and r["impl"] == "cuda_tuned" and r["layer"] == "end to end" and r["Nk"] == 4096)
    compulsory = 4 * 4 * 16 * 4096 * 64 * 4
    assert f"{e2e['median_ms']:.0f} ms" in text and f"about {compulsory / e2e['median_ms'] / 1e6:.0f} GB/s" in text


def test_chapter_10_marks_unrecorded_ptx_readings_and_drops_the_unrecorded_8x8_figure():
    assert "10.7 TFLOP/s" not in cell_text("10", "a714e0c9")
    assert cell_text("10", "4939e41f").count("not kept as a record") >= 1
    assert "not recorded" in cell_text("10", "4939e41f")

